//! "Can kroce reach NRI?": [`kroce_contracts::nri_reachability`], shared
//! with the node agent's condition and `doctor`.

pub use kroce_contracts::nri_reachability::*;
