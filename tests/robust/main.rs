//! Robustness: kiln against an independent reference on random programs.

mod differential;
