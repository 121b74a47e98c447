//! Memory node. (Being written.)
