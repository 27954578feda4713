use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A LIST that counts its calls and answers `items`.
async fn counted(calls: &AtomicUsize, items: Vec<u32>) -> Result<Vec<u32>, kube::Error> {
    calls.fetch_add(1, Ordering::SeqCst);
    Ok(items)
}

#[tokio::test]
async fn an_answer_is_kept_per_namespace_and_family() {
    let (cache, calls) = (Mutex::default(), AtomicUsize::new(0));
    let a = kept(&cache, "ns/a".into(), "x", "ns", counted(&calls, vec![1])).await;
    let again = kept(&cache, "ns/a".into(), "x", "ns", counted(&calls, vec![2])).await;
    assert_eq!(
        (a.unwrap().to_vec(), again.unwrap().to_vec()),
        (vec![1], vec![1]),
        "kept"
    );
    let other = kept(&cache, "ns2/a".into(), "x", "ns2", counted(&calls, vec![3])).await;
    assert_eq!(
        *other.unwrap(),
        vec![3],
        "another namespace is its own entry"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_list_that_does_not_answer_times_out_and_is_kept_briefly() {
    let cache = Mutex::default();
    let never = std::future::pending::<Result<Vec<u32>, kube::Error>>();
    let out = kept(&cache, "ns/a".into(), "memoryprofiles", "ns", never).await;
    assert!(matches!(out, Err(HistoryError::Timeout { .. })), "{out:?}");
    let calls = AtomicUsize::new(0);
    let out = kept(&cache, "ns/a".into(), "x", "ns", counted(&calls, vec![1])).await;
    assert!(out.is_err(), "the error is kept for a while");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_kept_answers_are_bounded() {
    let (cache, calls) = (Mutex::default(), AtomicUsize::new(0));
    for i in 0..MAX_KEPT + 10 {
        let key = format!("ns/{i}");
        kept(&cache, key, "x", "ns", counted(&calls, vec![]))
            .await
            .unwrap();
        assert!(lock(&cache).len() <= MAX_KEPT);
    }
}
