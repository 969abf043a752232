//! kroce's end-to-end tests live in `tests/` (see `README.md`): this crate
//! has no code of its own to ship.
