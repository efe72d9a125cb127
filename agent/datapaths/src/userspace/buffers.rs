//! The packet buffers the loop reuses, so that moving a packet allocates nothing once the loop runs warm.
//!
//! A buffer leaves the pool to receive a packet, travels with it through its delay line, and comes back when the
//! packet is sent. What a delay line holds beyond the pool's bound is allocated, and freed when sent, so the pool
//! never holds more than its bound however deep the queues grew.

/// Buffers ready to receive a packet, their capacities held to a bound in bytes.
#[derive(Debug)]
pub struct Buffers {
    free: Vec<Vec<u8>>,
    held: usize,
    limit: usize,
}

impl Buffers {
    /// A pool that keeps at most `limit` bytes of capacity.
    pub fn new(limit: usize) -> Buffers {
        Buffers { free: Vec::new(), held: 0, limit }
    }

    /// An empty buffer: one given back earlier, or a new one (no capacity yet) when none is left.
    pub fn take(&mut self) -> Vec<u8> {
        let buffer = self.free.pop().unwrap_or_default();
        self.held -= buffer.capacity();
        buffer
    }

    /// Keeps `buffer`, emptied, for a later packet, unless the pool holds its bound; then it is freed.
    pub fn give(&mut self, mut buffer: Vec<u8>) {
        if buffer.capacity() == 0 || self.held + buffer.capacity() > self.limit {
            return;
        }
        buffer.clear();
        self.held += buffer.capacity();
        self.free.push(buffer);
    }

    /// Bytes of capacity the pool keeps.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::Buffers;

    #[test]
    fn a_buffer_given_back_is_taken_again_empty() {
        let mut pool = Buffers::new(4096);
        let mut b = Vec::with_capacity(1500);
        b.extend_from_slice(&[7; 100]);
        let address = b.as_ptr();
        pool.give(b);
        assert_eq!(pool.held(), 1500);
        let again = pool.take();
        assert_eq!((again.as_ptr(), again.len(), again.capacity()), (address, 0, 1500));
        assert_eq!(pool.held(), 0);
        assert_eq!(pool.take().capacity(), 0, "an empty pool hands out a new buffer");
    }

    proptest! {
        /// Whatever is taken and given, the pool's capacity stays within its bound and its count is exact.
        #[test]
        fn the_pool_holds_its_bound(ops in proptest::collection::vec((any::<bool>(), 0usize..3000), 0..200)) {
            let mut pool = Buffers::new(8192);
            for (give, capacity) in ops {
                if give {
                    pool.give(Vec::with_capacity(capacity));
                } else {
                    pool.take();
                }
                prop_assert!(pool.held() <= 8192);
                prop_assert_eq!(pool.held(), pool.free.iter().map(Vec::capacity).sum::<usize>());
            }
        }
    }
}
