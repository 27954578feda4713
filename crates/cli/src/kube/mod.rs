//! The kubectl plugin: commands that read MemoryProfiles and MemoryReports
//! from the cluster ([`client`] connects and maps API errors to advice).

pub mod client;
pub mod compare;
pub mod completion;
pub mod doctor;
pub mod plot;
pub mod policy;
pub mod ranks;
pub mod recommend;
pub mod report;
pub mod top;
