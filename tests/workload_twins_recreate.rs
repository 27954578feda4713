//! The JobSet and PyTorchJob twins of the Job tests of the recreate
//! path's safety (docs/security.md and docs/remediation.md, "Twins per
//! kind"). Being written.
