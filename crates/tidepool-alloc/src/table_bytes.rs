// Bytes of the per-thread arena table, shared by build.rs (C shim) and the crate (checked there).
2048
