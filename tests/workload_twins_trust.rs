//! The JobSet and PyTorchJob twins of the Job tests of who may speak for
//! a workload (docs/security.md, "Twins per kind"). Being written.
