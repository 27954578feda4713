//! The runtime kit the roles share, below them all so that none of them
//! depends on another for it: [`backoff`], every retry schedule in one place,
//! named after what retries; [`http`], the one HTTP server of the roles'
//! plain-HTTP endpoints.

#![forbid(unsafe_code)]

pub mod backoff;
pub mod http;
