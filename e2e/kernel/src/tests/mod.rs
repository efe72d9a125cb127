//! The registry. Order matters only for reading the output: cheap kernel checks first.

#[cfg(feature = "datapath")]
mod datapath;
mod expect;
mod kernel;

use crate::harness::Test;

pub fn all() -> Vec<Test> {
    #[allow(unused_mut)]
    let mut tests = kernel::tests();
    #[cfg(feature = "datapath")]
    tests.extend(datapath::tests());
    tests
}
