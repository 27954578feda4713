//! Unit tests of `rank.rs`: layouts as torchrun numbers nodes.

use super::*;
use serde_json::json;

fn rjob(name: &str, replicas: u32, parallelism: u32, completions: Option<u32>) -> Value {
    json!({"name": name, "replicas": replicas,
           "template": {"spec": {"parallelism": parallelism, "completions": completions}}})
}

#[test]
fn jobset_ranks_follow_replicated_jobs_then_job_index_then_completion_index() {
    // A driver (1 Job of 1 pod), then 4 worker Jobs of 2 pods each.
    let spec =
        json!({"replicatedJobs": [rjob("driver", 1, 1, None), rjob("workers", 4, 2, Some(2))]});
    let shape = JobSetShape::from_spec(&spec).unwrap();
    assert_eq!(shape.ranks(), 9);
    assert_eq!(shape.rank("driver/0", 0), Some(0));
    assert_eq!(shape.rank("workers/0", 0), Some(1));
    assert_eq!(shape.rank("workers/0", 1), Some(2));
    assert_eq!(shape.rank("workers/3", 1), Some(8));
    // Every rank once: no two pods share one.
    let mut all: Vec<u32> = (0..4)
        .flat_map(|j| (0..2).map(move |c| (j, c)))
        .filter_map(|(j, c)| shape.rank(&format!("workers/{j}"), c))
        .collect();
    all.push(shape.rank("driver/0", 0).unwrap());
    all.sort();
    assert_eq!(all, (0..9).collect::<Vec<_>>());
    // Outside the shape: no rank.
    assert_eq!(shape.rank("workers/4", 0), None);
    assert_eq!(shape.rank("workers/0", 2), None);
    assert_eq!(shape.rank("driver/0", 1), None);
    assert_eq!(shape.rank("ghost/0", 0), None);
    assert_eq!(shape.rank("workers", 0), None);
}

#[test]
fn the_two_torchrun_layouts_of_jobset_give_the_node_rank() {
    // N Jobs of one pod (--node_rank=$(JOB_INDEX)).
    let one_pod_jobs =
        JobSetShape::from_spec(&json!({"replicatedJobs": [rjob("w", 8, 1, None)]})).unwrap();
    assert_eq!(
        (0..8)
            .map(|j| one_pod_jobs.rank(&format!("w/{j}"), 0).unwrap())
            .collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    // One Job of N pods (--node_rank=$(JOB_COMPLETION_INDEX)).
    let one_job =
        JobSetShape::from_spec(&json!({"replicatedJobs": [rjob("w", 1, 8, Some(8))]})).unwrap();
    assert_eq!(
        (0..8)
            .map(|c| one_job.rank("w/0", c).unwrap())
            .collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    // Defaults: replicas 1, parallelism 1.
    let bare = JobSetShape::from_spec(&json!({"replicatedJobs": [{"name": "w"}]})).unwrap();
    assert_eq!(bare.ranks(), 1);
}

#[test]
fn jobset_specs_memprof_cannot_lay_out_are_refused_bounded() {
    let many: Vec<Value> = (0..=MAX_REPLICATED_JOBS)
        .map(|i| rjob(&format!("r{i}"), 1, 1, None))
        .collect();
    assert_eq!(
        JobSetShape::from_spec(&json!({"replicatedJobs": many})),
        Err(ShapeError::ReplicatedJobs(65))
    );
    assert_eq!(
        JobSetShape::from_spec(&json!({})),
        Err(ShapeError::ReplicatedJobs(0))
    );
    let huge = json!({"replicatedJobs": [rjob("a", 1_000_000, 1, None), rjob("b", 1, 1, None)]});
    assert!(matches!(
        JobSetShape::from_spec(&huge),
        Err(ShapeError::Count(_))
    ));
    let overflow = json!({"replicatedJobs": [rjob("a", 1_000_000, 1_000_000, None)]});
    assert!(matches!(
        JobSetShape::from_spec(&overflow),
        Err(ShapeError::Count(_))
    ));
    let negative = json!({"replicatedJobs": [{"name": "a", "replicas": -1}]});
    assert!(matches!(
        JobSetShape::from_spec(&negative),
        Err(ShapeError::Count(_))
    ));
    let twice = json!({"replicatedJobs": [rjob("a", 1, 1, None), rjob("a", 1, 1, None)]});
    assert_eq!(JobSetShape::from_spec(&twice), Err(ShapeError::Name(1)));
}

#[test]
fn pytorchjob_ranks_are_the_master_then_the_workers_as_the_training_operator_sets_rank() {
    let spec =
        json!({"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 3}}});
    let shape = PyTorchShape::from_spec(&spec).unwrap();
    assert_eq!(shape.ranks(), 4);
    assert_eq!(shape.rank("master/0"), Some(0));
    assert_eq!(shape.rank("worker/0"), Some(1));
    assert_eq!(shape.rank("worker/2"), Some(3));
    assert_eq!(shape.rank("worker/3"), None);
    assert_eq!(shape.rank("master/1"), None);
    // Workers only (elastic): RANK is the worker's index.
    let workers =
        PyTorchShape::from_spec(&json!({"pytorchReplicaSpecs": {"Worker": {"replicas": 2}}}))
            .unwrap();
    assert_eq!(workers.rank("worker/1"), Some(1));
    assert_eq!(workers.rank("master/0"), None);
    let bad = json!({"pytorchReplicaSpecs": {"Worker": {"replicas": 2_000_000}}});
    assert!(PyTorchShape::from_spec(&bad).is_err());
}
