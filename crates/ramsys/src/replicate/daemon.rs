//! The daemon's `[[replicate]]` jobs (issue 38): started with the daemon,
//! reported in its status and metrics, resumed from their journals after a
//! restart.
