//! Pure: what an operator's reader should do about a failed write, from
//! the API server's answer, so a log line does not send someone to check
//! RBAC when etcd timed out.

/// The advice for a write the API server refused or failed; `rbac` names
/// the permission the write needs (e.g. `jobs: patch`). Whether the write is
/// tried again is the caller's to say (Events and policy statuses are not).
pub fn advice(error: &kube::Error, rbac: &str) -> String {
    match error {
        kube::Error::Api(s) if s.code == 401 || s.code == 403 => {
            format!("check RBAC ({rbac})")
        }
        kube::Error::Api(s) if s.code == 400 || s.code == 422 => {
            "the API server refused the object: check that crds/ is up to date".into()
        }
        kube::Error::Api(s) if s.code == 429 || s.code >= 500 => {
            "the API server is overloaded or failing (its log, or etcd's, says why)".into()
        }
        // No answer from the API server: a connection, TLS or credentials problem.
        _ => "cannot reach the API server as expected: check that it is up and that KUBECONFIG \
              (or the pod's service account) points at it"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        let mut s = kube::core::Status::failure("x", "");
        s.code = code;
        kube::Error::Api(s.boxed())
    }

    #[test]
    fn only_a_refusal_for_permission_points_at_rbac() {
        assert!(advice(&api(403), "jobs: patch").contains("check RBAC (jobs: patch)"));
        for code in [500, 503, 504, 429] {
            let a = advice(&api(code), "jobs: patch");
            assert!(!a.contains("RBAC"), "{code}: {a}");
            assert!(a.contains("overloaded or failing"), "{code}: {a}");
        }
        assert!(advice(&api(422), "x").contains("crds/"));
        // No HTTP answer at all: where the client points, not RBAC.
        let refused =
            kube::Error::ReadEvents(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let a = advice(&refused, "x");
        assert!(a.contains("KUBECONFIG") && !a.contains("RBAC"), "{a}");
        for code in [403, 422, 500] {
            let a = advice(&api(code), "x");
            assert!(
                !a.contains("retrying"),
                "the caller says whether it retries: {a}"
            );
        }
    }
}
