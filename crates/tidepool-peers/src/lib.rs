//! Peer servers on loopback. (Being written.)
