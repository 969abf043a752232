//! Admission perftests, RoCE diagnostics and counters.
