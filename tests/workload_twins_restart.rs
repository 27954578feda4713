//! The JobSet and PyTorchJob twins of the Job tests of a recreation that
//! is interrupted or contested (docs/security.md and docs/remediation.md,
//! "Twins per kind"). Being written.
