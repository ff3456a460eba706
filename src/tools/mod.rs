//! The commands beside the server, built from the server's own code: the self-contained
//! [`demo`], and [`explain`], which shows one request's decision step by step.

pub mod demo;
pub mod explain;
