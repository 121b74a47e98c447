use std::io;

/// What can go wrong setting up the pager. Failures while it runs (the far store becoming
/// unreachable) stop the program instead: its memory cannot be given back to it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PagerError {
    #[error("cannot open a userfaultfd object: {0}")]
    Userfaultfd(#[source] io::Error),
    #[error("cannot reserve address space for far memory: {0}")]
    Reserve(#[source] io::Error),
    #[error("cannot register the region with userfaultfd: {0}")]
    Register(#[source] io::Error),
    #[error("cannot start a pager thread: {0}")]
    Thread(#[source] io::Error),
    #[error("a region of {0} bytes is larger than the 16 TiB a pager region can be")]
    TooLarge(usize),
    #[error("a pager can have at most {0} regions at once")]
    TooManyRegions(usize),
}
