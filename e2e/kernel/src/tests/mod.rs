//! The registry. Order matters only for reading the output: cheap kernel checks first.

#[cfg(feature = "datapath")]
mod bench;
#[cfg(feature = "datapath")]
mod datapath;
#[cfg(feature = "datapath")]
mod emulator;
mod expect;
mod kernel;
#[cfg(feature = "datapath")]
mod queue_bound;
#[cfg(feature = "datapath")]
mod windows;

use crate::harness::Test;

pub fn all() -> Vec<Test> {
    #[allow(unused_mut)]
    let mut tests = kernel::tests();
    #[cfg(feature = "datapath")]
    tests.extend(datapath::tests());
    #[cfg(feature = "datapath")]
    tests.extend(queue_bound::tests());
    #[cfg(feature = "datapath")]
    tests.extend(windows::tests());
    tests
}

/// The benchmark (`--bench`), apart from the tests: it measures and judges nothing.
pub fn benches() -> Vec<Test> {
    #[cfg(feature = "datapath")]
    return bench::benches();
    #[cfg(not(feature = "datapath"))]
    Vec::new()
}
