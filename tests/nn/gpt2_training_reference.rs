//! Written by tests/nn/gpt2_training_reference.py (PyTorch 2.11.0, f32, CPU); do not edit.

pub const BATCH: usize = 3;
pub const SEQ: usize = 12;

/// The loss of each AdamW step, before its update.
pub const LOSSES: [f64; 10] = [
    7.929559707641602,
    6.905650615692139,
    6.033300876617432,
    5.295212745666504,
    4.6797590255737305,
    4.156787872314453,
    3.6938743591308594,
    3.274613857269287,
    2.889464855194092,
    2.5332095623016357,
];
