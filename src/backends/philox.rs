//! Counter-based random numbers (placeholder for the CPU helper to fill).
