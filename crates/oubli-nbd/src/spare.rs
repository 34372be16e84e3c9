//! Spare read-reply buffers: a large read reuses one instead of allocating and zeroing its output each time.

use std::sync::Mutex;
use zeroize::Zeroize;

/// A bounded stack of buffers that read replies are made in and given back
/// to once sent.
///
/// Why: a reply is up to 32 MiB, made by the engine and dropped once it is
/// on the socket. The allocator serves a freed megabyte from its heap, so a
/// fresh `vec![0; n]` costs a `memset` of the whole reply, and with the
/// allocation that was about a tenth of the server's CPU in 1 MiB sequential
/// reads. A reused buffer is only written by the read itself
/// ([`oubli_core::Store::read_into`]).
///
/// Bounded twice: at most [`Self::KEEP`] buffers are kept, each of at most
/// [`Self::MAX_CAPACITY`] bytes (larger ones are freed after their reply),
/// so the spares hold at most 16 MiB (DESIGN §10). They hold the plaintext
/// of past replies, as freed heap memory would; they are wiped when the
/// server ends.
pub(crate) struct SpareBuffers {
    list: Mutex<Vec<Vec<u8>>>,
}

impl SpareBuffers {
    /// Buffers kept at most: two connections of 1 MiB reads at queue depth four.
    pub(crate) const KEEP: usize = 8;
    /// The largest buffer kept: a 1 MiB read's sealed cells with room to spare.
    pub(crate) const MAX_CAPACITY: usize = 2 << 20;

    pub(crate) fn new() -> Self {
        SpareBuffers {
            list: Mutex::new(Vec::with_capacity(Self::KEEP)),
        }
    }

    /// A spare buffer, or an empty one when none is left.
    pub(crate) fn take(&self) -> Vec<u8> {
        self.lock().pop().unwrap_or_default()
    }

    /// Keeps `buf` for a later reply if there is room for it; frees it otherwise.
    pub(crate) fn give_back(&self, buf: Vec<u8>) {
        if buf.capacity() == 0 {
            return;
        }
        // Not kept (too large, or enough kept): freed, as every reply was
        // before there were spares.
        if buf.capacity() <= Self::MAX_CAPACITY {
            let mut list = self.lock();
            if list.len() < Self::KEEP {
                list.push(buf);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for SpareBuffers {
    fn drop(&mut self) {
        for buf in self.lock().iter_mut() {
            buf.zeroize();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_a_bounded_number_of_bounded_buffers() {
        let spares = SpareBuffers::new();
        assert_eq!(spares.take().capacity(), 0, "none to begin with");
        for _ in 0..SpareBuffers::KEEP + 3 {
            spares.give_back(vec![1; 4096]);
        }
        spares.give_back(vec![1; SpareBuffers::MAX_CAPACITY + 1]);
        spares.give_back(Vec::new());
        let mut kept = Vec::new();
        loop {
            let b = spares.take();
            if b.capacity() == 0 {
                break;
            }
            kept.push(b);
        }
        assert_eq!(kept.len(), SpareBuffers::KEEP);
        assert!(kept
            .iter()
            .all(|b| b.capacity() <= SpareBuffers::MAX_CAPACITY));
    }
}
