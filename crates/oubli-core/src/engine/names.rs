//! Directory entries: names in buckets of the tree, keyed by a hash of the name (link, unlink, rename, lookup, list).

use super::*;

impl Store {
    /// Adds `name` in directory object `dir` pointing at `target`.
    pub fn link(&self, dir: u64, name: &[u8], target: u64) -> Result<()> {
        let mut e = self.lock_beside_commit();
        e.mutable()?;
        e.record(dir)?;
        let hash = name_hash(name);
        let mut bucket = e.bucket(dir, hash)?;
        if bucket.entries.iter().any(|(n, _)| n == name) {
            return Err(Error::Exists(String::from_utf8_lossy(name).into_owned()));
        }
        bucket.entries.push((name.to_vec(), target));
        e.apply(Op::PutNames { dir, hash, bucket }, true)
    }

    /// Removes `name` from `dir`; returns the object it named (which is not deleted).
    pub fn unlink(&self, dir: u64, name: &[u8]) -> Result<u64> {
        let mut e = self.lock_beside_commit();
        e.mutable()?;
        let hash = name_hash(name);
        let mut bucket = e.bucket(dir, hash)?;
        let i = bucket
            .entries
            .iter()
            .position(|(n, _)| n == name)
            .ok_or_else(|| Error::NoName(String::from_utf8_lossy(name).into_owned()))?;
        let (_, target) = bucket.entries.remove(i);
        e.apply(Op::PutNames { dir, hash, bucket }, true)?;
        self.settle(e);
        Ok(target)
    }

    /// Moves `src_name` in `src_dir` to `dst_name` in `dst_dir` in one step
    /// (both changes land in the same intent-log batch). An existing
    /// `dst_name` is replaced only when `replace` is set; its target is
    /// returned (and not deleted: a front-end decides about links).
    pub fn rename(
        &self,
        src_dir: u64,
        src_name: &[u8],
        dst_dir: u64,
        dst_name: &[u8],
        replace: bool,
    ) -> Result<Option<u64>> {
        let mut e = self.lock_beside_commit();
        e.mutable()?;
        e.record(dst_dir)?;
        let src_hash = name_hash(src_name);
        let mut src_bucket = e.bucket(src_dir, src_hash)?;
        let i = src_bucket
            .entries
            .iter()
            .position(|(n, _)| n == src_name)
            .ok_or_else(|| Error::NoName(String::from_utf8_lossy(src_name).into_owned()))?;
        if src_dir == dst_dir && src_name == dst_name {
            return Ok(None);
        }
        let target = src_bucket.entries[i].1;
        let dst_hash = name_hash(dst_name);
        let mut dst_bucket = e.bucket(dst_dir, dst_hash)?;
        let replaced = match dst_bucket.entries.iter().position(|(n, _)| n == dst_name) {
            Some(_) if !replace => {
                return Err(Error::Exists(
                    String::from_utf8_lossy(dst_name).into_owned(),
                ))
            }
            Some(j) => Some(std::mem::replace(&mut dst_bucket.entries[j].1, target)),
            None => {
                dst_bucket.entries.push((dst_name.to_vec(), target));
                None
            }
        };
        if (src_dir, src_hash) == (dst_dir, dst_hash) {
            // Same bucket: apply both changes to one copy.
            let bucket = &mut dst_bucket;
            let k = bucket
                .entries
                .iter()
                .position(|(n, _)| n == src_name)
                .expect("source still present");
            bucket.entries.remove(k);
        } else {
            src_bucket.entries.remove(i);
            e.apply(
                Op::PutNames {
                    dir: src_dir,
                    hash: src_hash,
                    bucket: src_bucket,
                },
                true,
            )?;
        }
        e.apply(
            Op::PutNames {
                dir: dst_dir,
                hash: dst_hash,
                bucket: dst_bucket,
            },
            true,
        )?;
        self.settle(e);
        Ok(replaced)
    }

    pub fn lookup(&self, dir: u64, name: &[u8]) -> Result<Option<u64>> {
        let e = self.lock_beside_commit();
        let bucket = e.bucket(dir, name_hash(name))?;
        Ok(bucket
            .entries
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| *t))
    }

    /// Every (name, target) in `dir`, in hash order.
    pub fn list(&self, dir: u64) -> Result<Vec<(Vec<u8>, u64)>> {
        let e = self.lock_beside_commit();
        let mut out = Vec::new();
        e.tree.scan(
            &Key::new(dir, KIND_NAMES, 0),
            &Key::new(dir, KIND_NAMES + 1, 0),
            &e.ctx,
            &mut |_, v| {
                if let Value::Names(b) = v {
                    out.extend(b.entries.iter().cloned());
                }
                true
            },
        )?;
        Ok(out)
    }
}
