//! The copy-on-write B+tree that is also the key tree: every node is sealed under its own key, kept in its parent.
//!
//! One tree holds everything (btrfs-style): object records, the cells of each
//! object's data and directory entries, ordered by [`Key`]. Clean nodes are
//! referenced by [`NodePtr`] (address + key reference) and loaded on demand;
//! a modification path-copies from the root down (`make_mut`), turning the
//! path into in-memory nodes that are written, each with a fresh key, at the
//! next commit. The old on-medium copies of the path are reported as freed:
//! nothing but their old parents — themselves replaced — ever held their keys.

use crate::codec::{varint_len, DecodeError, Reader, Writer};
use crate::error::Result;
pub use crate::holes::Holes;
use oubli_crypto::KeyRef;
use std::sync::Arc;

/// Serialized size above which a node splits.
pub const NODE_MAX: usize = 16 * 1024;
/// Serialized size below which a node is merged with a neighbour.
const NODE_MIN: usize = NODE_MAX / 4;

pub const KIND_OBJECT: u8 = 0;
pub const KIND_CELL: u8 = 1;
pub const KIND_NAMES: u8 = 2;
/// The key share an object's data is placed under (format 3).
pub const KIND_SHARE: u8 = 3;
/// The cell size of an object whose cells are not the store's (format 5).
pub const KIND_CELLS: u8 = 4;

/// Position of an entry in the tree: (object id, kind, offset).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub oid: u64,
    pub kind: u8,
    pub off: u64,
}

impl Key {
    pub const MIN: Key = Key {
        oid: 0,
        kind: 0,
        off: 0,
    };
    pub fn new(oid: u64, kind: u8, off: u64) -> Key {
        Key { oid, kind, off }
    }
}

/// Address of a unit on the medium: segment id in the high 32 bits, byte offset in the low.
pub type Addr = u64;

pub fn addr(segment: u32, offset: u32) -> Addr {
    ((segment as u64) << 32) | offset as u64
}
pub fn addr_segment(a: Addr) -> u32 {
    (a >> 32) as u32
}
pub fn addr_offset(a: Addr) -> u32 {
    a as u32
}

/// Where a node lives and the reference to its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePtr {
    pub addr: Addr,
    pub len: u32,
    pub key: KeyRef,
}

/// One cell of an object's data: bytes `[start, start+len)` of cell `index`
/// (the object range `index*cell_size + start ..`), sealed as one unit of
/// `len + TAG_LEN` bytes at `addr`. Bytes of the cell outside that range are a hole,
/// and so are the `holes` inside it (stored as zeros; see `crate::holes`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CellRef {
    pub start: u32,
    pub len: u32,
    pub addr: Addr,
    pub key: KeyRef,
    pub holes: Holes,
}

impl CellRef {
    pub fn sealed_len(&self) -> u64 {
        self.len as u64 + oubli_crypto::TAG_LEN as u64
    }

    /// The cell-relative ranges that hold data: the stored range less its holes.
    pub fn data_ranges(&self) -> Vec<(u32, u32)> {
        crate::holes::data_ranges(self.start, self.start.saturating_add(self.len), &self.holes)
    }
}

/// An object's record: its size and front-end metadata (opaque to the engine).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ObjectRecord {
    pub size: u64,
    pub meta: Vec<u8>,
}

/// Directory entries whose names hash to the same value.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct NameBucket {
    pub entries: Vec<(Vec<u8>, u64)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Object(ObjectRecord),
    Cell(CellRef),
    Names(NameBucket),
    /// The id of the share every cell of the object depends on.
    Share(u32),
    /// The object's cell size, when it is not the store's.
    CellSize(u32),
}

impl Value {
    fn kind(&self) -> u8 {
        match self {
            Value::Object(_) => KIND_OBJECT,
            Value::Cell(_) => KIND_CELL,
            Value::Names(_) => KIND_NAMES,
            Value::Share(_) => KIND_SHARE,
            Value::CellSize(_) => KIND_CELLS,
        }
    }
    /// Heap bytes the decoded value owns beyond its slot in a node's vector.
    fn heap_bytes(&self) -> usize {
        fn vec_bytes<T>(v: &Vec<T>) -> usize {
            match v.capacity() {
                0 => 0,
                n => n * std::mem::size_of::<T>() + ALLOC_OVERHEAD,
            }
        }
        match self {
            Value::Object(r) => vec_bytes(&r.meta),
            Value::Cell(c) => vec_bytes(&c.holes),
            Value::Names(b) => {
                vec_bytes(&b.entries) + b.entries.iter().map(|(n, _)| vec_bytes(n)).sum::<usize>()
            }
            Value::Share(_) | Value::CellSize(_) => 0,
        }
    }

    fn approx_size(&self) -> usize {
        match self {
            Value::Object(r) => 12 + r.meta.len(),
            Value::Cell(c) => {
                let key = if short_key(&c.key).is_some() { 9 } else { 32 };
                12 + key + 10 * c.holes.len()
            }
            Value::Names(b) => 2 + b.entries.iter().map(|(n, _)| n.len() + 10).sum::<usize>(),
            Value::Share(_) | Value::CellSize(_) => 5,
        }
    }
}

#[derive(Clone, Debug)]
pub enum Child {
    Disk(NodePtr),
    Mem(Arc<Node>),
}

#[derive(Clone, Debug)]
pub enum Node {
    Leaf(Leaf),
    /// Children with the lowest key each may hold (the first is unbounded below).
    Inner(u8, Vec<(Key, Child)>),
}

/// A leaf's entries in key order, with their serialized size and heap
/// memory kept up to date as they change: the split check after an insert
/// then costs nothing, where summing a few hundred entries after every cell
/// written was the largest single cost of a write under the engine lock;
/// and measuring the changed nodes' memory (`Tree::dirty_mem_bytes`) costs
/// one step per node, not per entry.
#[derive(Clone, Debug)]
pub struct Leaf {
    entries: Vec<(Key, Value)>,
    /// `4 + Σ entry_size`: what [`Node::approx_size`] reports for the leaf.
    size: usize,
    /// `Σ Value::heap_bytes`: the entries' own allocations.
    heap: usize,
}

/// An entry's share of its leaf's serialized size.
fn entry_size(v: &Value) -> usize {
    4 + v.approx_size()
}

impl Leaf {
    pub fn new(entries: Vec<(Key, Value)>) -> Leaf {
        let size = 4 + entries.iter().map(|(_, v)| entry_size(v)).sum::<usize>();
        let heap = entries.iter().map(|(_, v)| v.heap_bytes()).sum();
        Leaf {
            entries,
            size,
            heap,
        }
    }
    pub fn into_entries(self) -> Vec<(Key, Value)> {
        self.entries
    }
    fn capacity(&self) -> usize {
        self.entries.capacity()
    }
    fn insert(&mut self, i: usize, key: Key, value: Value) {
        self.size += entry_size(&value);
        self.heap += value.heap_bytes();
        self.entries.insert(i, (key, value));
    }
    fn replace(&mut self, i: usize, value: Value) -> Value {
        let old = &self.entries[i].1;
        self.size = self.size + entry_size(&value) - entry_size(old);
        self.heap = self.heap + value.heap_bytes() - old.heap_bytes();
        std::mem::replace(&mut self.entries[i].1, value)
    }
    fn remove(&mut self, i: usize) -> Value {
        let (_, v) = self.entries.remove(i);
        self.size -= entry_size(&v);
        self.heap -= v.heap_bytes();
        v
    }
    fn split_off(&mut self, at: usize) -> Leaf {
        let right = Leaf::new(self.entries.split_off(at));
        self.size -= right.size - 4;
        self.heap -= right.heap;
        right
    }
    fn append(&mut self, other: Leaf) {
        self.size += other.size - 4;
        self.heap += other.heap;
        self.entries.extend(other.entries);
    }
}

impl Default for Leaf {
    /// An empty leaf: its size is the entry count's 4 bytes.
    fn default() -> Leaf {
        Leaf::new(Vec::new())
    }
}

impl std::ops::Deref for Leaf {
    type Target = [(Key, Value)];
    fn deref(&self) -> &[(Key, Value)] {
        &self.entries
    }
}

impl IntoIterator for Leaf {
    type Item = (Key, Value);
    type IntoIter = std::vec::IntoIter<(Key, Value)>;
    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

impl<'a> IntoIterator for &'a Leaf {
    type Item = &'a (Key, Value);
    type IntoIter = std::slice::Iter<'a, (Key, Value)>;
    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter()
    }
}

/// What the allocator adds to each heap allocation (glibc: 16 bytes).
const ALLOC_OVERHEAD: usize = 16;

const ENTRY_KEY_MAX: usize = 20;
const CHILD_SIZE: usize = ENTRY_KEY_MAX + 10 + 5 + 32;

impl Node {
    /// A leaf holding `entries` (in key order).
    pub fn leaf(entries: Vec<(Key, Value)>) -> Node {
        Node::Leaf(Leaf::new(entries))
    }
    pub fn level(&self) -> u8 {
        match self {
            Node::Leaf(_) => 0,
            Node::Inner(level, _) => *level,
        }
    }
    /// Bytes of memory the decoded node takes: what the node cache counts
    /// against its limit. A decoded node is several times its sealed size
    /// (a fixed-size slot per entry, separate allocations for names and
    /// metadata), so counting sealed bytes let the cache hold about seven
    /// times its limit.
    pub fn mem_bytes(&self) -> usize {
        use std::mem::size_of;
        ALLOC_OVERHEAD
            + size_of::<Node>()
            + match self {
                Node::Leaf(leaf) => leaf.capacity() * size_of::<(Key, Value)>() + leaf.heap,
                Node::Inner(_, children) => children.capacity() * size_of::<(Key, Child)>(),
            }
    }

    fn approx_size(&self) -> usize {
        match self {
            Node::Leaf(leaf) => leaf.size,
            Node::Inner(_, children) => 4 + children.len() * CHILD_SIZE,
        }
    }
    fn len(&self) -> usize {
        match self {
            Node::Leaf(e) => e.len(),
            Node::Inner(_, c) => c.len(),
        }
    }
}

/// Loads and authenticates a node from the medium (through a cache).
pub trait NodeSource {
    fn load(&self, ptr: &NodePtr, level: u8) -> Result<Arc<Node>>;
}

/// The tree: a root (or nothing) and the level of the root.
#[derive(Clone, Debug, Default)]
pub struct Tree {
    pub root: Option<(Child, u8)>,
    /// Nodes made in memory (copied from the medium or new) since the last
    /// [`Tree::persist`]: an upper bound on the changed nodes, which tells
    /// the engine when to measure their memory again.
    dirty_nodes: usize,
}

fn child_node(child: &Child, level: u8, src: &dyn NodeSource) -> Result<Arc<Node>> {
    match child {
        Child::Mem(node) => Ok(node.clone()),
        Child::Disk(ptr) => src.load(ptr, level),
    }
}

/// Turns `child` into an exclusively owned in-memory node, reporting the
/// on-medium copy it replaces as freed.
fn make_mut<'a>(
    child: &'a mut Child,
    level: u8,
    src: &dyn NodeSource,
    freed: &mut Vec<NodePtr>,
) -> Result<&'a mut Node> {
    if let Child::Disk(ptr) = child {
        let node = src.load(ptr, level)?;
        freed.push(ptr.clone());
        *child = Child::Mem(node);
    }
    match child {
        Child::Mem(node) => Ok(Arc::make_mut(node)),
        Child::Disk(_) => unreachable!("converted above"),
    }
}

fn child_index(children: &[(Key, Child)], key: &Key) -> usize {
    // Last child whose lower bound is <= key; the first child is unbounded below.
    children
        .partition_point(|(k, _)| k <= key)
        .saturating_sub(1)
}

/// Splits an oversized node in two halves by size; returns the right half and its lower bound.
fn split(node: &mut Node) -> Option<(Key, Node)> {
    if node.approx_size() <= NODE_MAX || node.len() < 2 {
        return None;
    }
    let half = node.approx_size() / 2;
    match node {
        Node::Leaf(entries) => {
            let mut acc = 4;
            let mut at = entries.len() - 1;
            for (i, (_, v)) in entries.iter().enumerate() {
                acc += entry_size(v);
                if acc >= half {
                    at = (i + 1).min(entries.len() - 1);
                    break;
                }
            }
            let right = entries.split_off(at.max(1));
            Some((right[0].0, Node::Leaf(right)))
        }
        Node::Inner(level, children) => {
            let at = children.len() / 2;
            let right = children.split_off(at);
            Some((right[0].0, Node::Inner(*level, right)))
        }
    }
}

impl Tree {
    /// Looks a key up.
    pub fn get(&self, key: &Key, src: &dyn NodeSource) -> Result<Option<Value>> {
        let Some((root, level)) = &self.root else {
            return Ok(None);
        };
        let mut node = child_node(root, *level, src)?;
        loop {
            let next = match &*node {
                Node::Leaf(entries) => {
                    return Ok(entries
                        .binary_search_by(|(k, _)| k.cmp(key))
                        .ok()
                        .map(|i| entries[i].1.clone()));
                }
                Node::Inner(level, children) => {
                    let i = child_index(children, key);
                    child_node(&children[i].1, level - 1, src)?
                }
            };
            node = next;
        }
    }

    /// Calls `visit` for every entry with `from <= key < to`, in order, until it returns false.
    pub fn scan(
        &self,
        from: &Key,
        to: &Key,
        src: &dyn NodeSource,
        visit: &mut dyn FnMut(&Key, &Value) -> bool,
    ) -> Result<()> {
        if let Some((root, level)) = &self.root {
            let node = child_node(root, *level, src)?;
            scan_node(&node, from, to, src, visit)?;
        }
        Ok(())
    }

    /// Inserts or replaces; returns the previous value.
    pub fn insert(
        &mut self,
        key: Key,
        value: Value,
        src: &dyn NodeSource,
        freed: &mut Vec<NodePtr>,
    ) -> Result<Option<Value>> {
        let Some((root, level)) = &mut self.root else {
            self.root = Some((
                Child::Mem(Arc::new(Node::Leaf(Leaf::new(vec![(key, value)])))),
                0,
            ));
            self.dirty_nodes += 1;
            return Ok(None);
        };
        let copied = freed.len();
        let mut splits = 0;
        let (old, split_off) = insert_rec(root, *level, key, value, src, freed, &mut splits)?;
        self.dirty_nodes += freed.len() - copied + splits;
        if let Some((sep, right)) = split_off {
            self.dirty_nodes += 2;
            let left = std::mem::replace(root, Child::Mem(Arc::new(Node::Leaf(Leaf::default()))));
            *root = Child::Mem(Arc::new(Node::Inner(
                *level + 1,
                vec![(Key::MIN, left), (sep, Child::Mem(Arc::new(right)))],
            )));
            *level += 1;
        }
        Ok(old)
    }

    /// Removes a key; returns its value.
    pub fn remove(
        &mut self,
        key: &Key,
        src: &dyn NodeSource,
        freed: &mut Vec<NodePtr>,
    ) -> Result<Option<Value>> {
        // Avoid path-copying when the key is absent.
        if self.root.is_none() || self.get(key, src)?.is_none() {
            return Ok(None);
        }
        let copied = freed.len();
        let (root, level) = self.root.as_mut().expect("checked above");
        let old = remove_rec(root, *level, key, src, freed)?;
        self.collapse(src, freed)?;
        self.dirty_nodes += freed.len() - copied;
        Ok(old)
    }

    /// Shrinks the root: an empty leaf becomes no tree, an inner root with one child is replaced by it.
    fn collapse(&mut self, src: &dyn NodeSource, freed: &mut Vec<NodePtr>) -> Result<()> {
        loop {
            let Some((root, level)) = &mut self.root else {
                return Ok(());
            };
            let shrink = match &*child_node(root, *level, src)? {
                Node::Leaf(entries) => entries.is_empty(),
                Node::Inner(_, children) => children.len() == 1,
            };
            if !shrink {
                return Ok(());
            }
            match make_mut(root, *level, src, freed)? {
                Node::Leaf(_) => {
                    self.root = None;
                }
                Node::Inner(_, children) => {
                    let (_, only) = children.pop().expect("one child");
                    *root = only;
                    *level -= 1;
                }
            }
        }
    }

    /// The tree whose root is `root` on the medium (or an empty tree).
    pub fn on_medium(root: Option<(NodePtr, u8)>) -> Tree {
        Tree {
            root: root.map(|(ptr, level)| (Child::Disk(ptr), level)),
            dirty_nodes: 0,
        }
    }

    /// Nodes made in memory since the last persist (an upper bound).
    pub fn dirty_nodes(&self) -> usize {
        self.dirty_nodes
    }

    /// Memory held by the nodes changed since the last persist (the
    /// in-memory ones; clean nodes are the cache's).
    pub fn dirty_mem_bytes(&self) -> usize {
        fn of(child: &Child) -> usize {
            let Child::Mem(node) = child else {
                return 0;
            };
            node.mem_bytes()
                + match &**node {
                    Node::Inner(_, children) => children.iter().map(|(_, c)| of(c)).sum(),
                    Node::Leaf(_) => 0,
                }
        }
        self.root.as_ref().map_or(0, |(root, _)| of(root))
    }

    /// Writes every in-memory node, children first, through `sink` (which
    /// seals it under a fresh key and returns its pointer); afterwards the
    /// whole tree is clean. Returns the root pointer and level.
    pub fn persist(
        &mut self,
        sink: &mut dyn FnMut(&Arc<Node>) -> Result<NodePtr>,
    ) -> Result<Option<(NodePtr, u8)>> {
        let Some((root, level)) = &mut self.root else {
            return Ok(None);
        };
        persist_rec(root, sink)?;
        self.dirty_nodes = 0;
        match root {
            Child::Disk(ptr) => Ok(Some((ptr.clone(), *level))),
            Child::Mem(_) => unreachable!("persisted"),
        }
    }

    /// Visits every node reachable from the root (loading clean ones), with
    /// its pointer when it is on the medium. Used by the cleaner and audit.
    pub fn walk(
        &self,
        src: &dyn NodeSource,
        visit: &mut dyn FnMut(Option<&NodePtr>, &Node) -> Result<()>,
    ) -> Result<()> {
        if let Some((root, level)) = &self.root {
            walk_rec(root, *level, src, visit)?;
        }
        Ok(())
    }

    /// Path-copies every node for which `rewrite_node` says yes, and lets
    /// `rewrite_value` change leaf values in place. Subtrees that need
    /// neither are left untouched. Used by the cleaner to move live units
    /// out of victim segments.
    ///
    /// Starts at the key `from` (values below it are not visited), and
    /// stops where `rewrite_value` says [`Visit::Stop`] or, since the nodes
    /// it changes stay in memory until a commit, where they have taken
    /// `budget` bytes (counted down). Returns `None` when it went through
    /// the rest of the tree, or the key to start the next call at.
    pub fn rewrite(
        &mut self,
        src: &dyn NodeSource,
        freed: &mut Vec<NodePtr>,
        budget: &mut usize,
        from: Option<&Key>,
        rewrite_node: &dyn Fn(&NodePtr) -> bool,
        rewrite_value: &mut dyn FnMut(&Key, &mut Value) -> Result<Visit>,
    ) -> Result<Option<Key>> {
        let Some((root, level)) = &mut self.root else {
            return Ok(None);
        };
        let copied = freed.len();
        let mut rw = Rewrite {
            src,
            budget,
            from,
            resume: None,
            rewrite_node,
            rewrite_value,
        };
        rw.node(root, *level, from.copied().unwrap_or(Key::MIN), freed)?;
        self.dirty_nodes += freed.len() - copied;
        Ok(rw.resume)
    }
}

fn scan_node(
    node: &Node,
    from: &Key,
    to: &Key,
    src: &dyn NodeSource,
    visit: &mut dyn FnMut(&Key, &Value) -> bool,
) -> Result<bool> {
    match node {
        Node::Leaf(entries) => {
            let start = entries.partition_point(|(k, _)| k < from);
            for (k, v) in &entries[start..] {
                if k >= to || !visit(k, v) {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Node::Inner(level, children) => {
            let start = child_index(children, from);
            for (i, (lower, child)) in children.iter().enumerate().skip(start) {
                if i > start && lower >= to {
                    return Ok(false);
                }
                let n = child_node(child, level - 1, src)?;
                if !scan_node(&n, from, to, src, visit)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
    }
}

type Split = Option<(Key, Node)>;

fn insert_rec(
    child: &mut Child,
    level: u8,
    key: Key,
    value: Value,
    src: &dyn NodeSource,
    freed: &mut Vec<NodePtr>,
    splits: &mut usize,
) -> Result<(Option<Value>, Split)> {
    let node = make_mut(child, level, src, freed)?;
    let old = match node {
        Node::Leaf(entries) => match entries.binary_search_by(|(k, _)| k.cmp(&key)) {
            Ok(i) => Some(entries.replace(i, value)),
            Err(i) => {
                entries.insert(i, key, value);
                None
            }
        },
        Node::Inner(level, children) => {
            let i = child_index(children, &key);
            let (old, split_off) = insert_rec(
                &mut children[i].1,
                *level - 1,
                key,
                value,
                src,
                freed,
                splits,
            )?;
            if let Some((sep, right)) = split_off {
                *splits += 1;
                children.insert(i + 1, (sep, Child::Mem(Arc::new(right))));
            }
            old
        }
    };
    Ok((old, split(node)))
}

fn remove_rec(
    child: &mut Child,
    level: u8,
    key: &Key,
    src: &dyn NodeSource,
    freed: &mut Vec<NodePtr>,
) -> Result<Option<Value>> {
    let node = make_mut(child, level, src, freed)?;
    match node {
        Node::Leaf(entries) => Ok(entries
            .binary_search_by(|(k, _)| k.cmp(key))
            .ok()
            .map(|i| entries.remove(i))),
        Node::Inner(level, children) => {
            let level = *level;
            let i = child_index(children, key);
            let old = remove_rec(&mut children[i].1, level - 1, key, src, freed)?;
            rebalance(children, i, level, src, freed)?;
            Ok(old)
        }
    }
}

/// After a removal below `children[i]`: drops it if empty, merges it with a
/// neighbour if both fit in one node.
fn rebalance(
    children: &mut Vec<(Key, Child)>,
    i: usize,
    level: u8,
    src: &dyn NodeSource,
    freed: &mut Vec<NodePtr>,
) -> Result<()> {
    let node = child_node(&children[i].1, level - 1, src)?;
    if node.len() == 0 {
        let (lower, _) = children.remove(i);
        // Keep the first child unbounded below.
        if i == 0 && !children.is_empty() {
            children[0].0 = lower;
        }
        return Ok(());
    }
    if node.approx_size() >= NODE_MIN || children.len() < 2 {
        return Ok(());
    }
    let (left, right) = if i + 1 < children.len() {
        (i, i + 1)
    } else {
        (i - 1, i)
    };
    let left_size = child_node(&children[left].1, level - 1, src)?.approx_size();
    let right_size = child_node(&children[right].1, level - 1, src)?.approx_size();
    if left_size + right_size > NODE_MAX {
        return Ok(());
    }
    let (_, right_child) = children.remove(right);
    let mut right_child = right_child;
    let right_node = std::mem::replace(
        make_mut(&mut right_child, level - 1, src, freed)?,
        Node::Leaf(Leaf::default()),
    );
    let left_node = make_mut(&mut children[left].1, level - 1, src, freed)?;
    match (left_node, right_node) {
        (Node::Leaf(l), Node::Leaf(r)) => l.append(r),
        (Node::Inner(_, l), Node::Inner(_, r)) => l.extend(r),
        _ => unreachable!("siblings have the same level"),
    }
    Ok(())
}

fn persist_rec(
    child: &mut Child,
    sink: &mut dyn FnMut(&Arc<Node>) -> Result<NodePtr>,
) -> Result<()> {
    let Child::Mem(node) = child else {
        return Ok(());
    };
    if let Node::Inner(_, children) = Arc::make_mut(node) {
        for (_, c) in children.iter_mut() {
            persist_rec(c, sink)?;
        }
    }
    let ptr = sink(node)?;
    *child = Child::Disk(ptr);
    Ok(())
}

fn walk_rec(
    child: &Child,
    level: u8,
    src: &dyn NodeSource,
    visit: &mut dyn FnMut(Option<&NodePtr>, &Node) -> Result<()>,
) -> Result<()> {
    let node = child_node(child, level, src)?;
    let ptr = match child {
        Child::Disk(p) => Some(p),
        Child::Mem(_) => None,
    };
    visit(ptr, &node)?;
    if let Node::Inner(level, children) = &*node {
        for (_, c) in children {
            walk_rec(c, level - 1, src, visit)?;
        }
    }
    Ok(())
}

/// What [`Tree::rewrite`]'s value callback did with a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visit {
    Unchanged,
    Changed,
    /// Left it unchanged, and the walk stops here: the next call starts
    /// at this value's key.
    Stop,
}

/// One [`Tree::rewrite`] walk: what it asks, and what it may still change.
struct Rewrite<'a> {
    src: &'a dyn NodeSource,
    budget: &'a mut usize,
    /// Values below it are not visited.
    from: Option<&'a Key>,
    /// Set when the walk stopped: where the next one starts.
    resume: Option<Key>,
    rewrite_node: &'a dyn Fn(&NodePtr) -> bool,
    rewrite_value: &'a mut dyn FnMut(&Key, &mut Value) -> Result<Visit>,
}

impl Rewrite<'_> {
    /// Rewrites `child`'s subtree, whose keys are at least `lower`; returns
    /// whether it changed.
    fn node(
        &mut self,
        child: &mut Child,
        level: u8,
        lower: Key,
        freed: &mut Vec<NodePtr>,
    ) -> Result<bool> {
        if self.resume.is_some() {
            return Ok(false);
        }
        if *self.budget == 0 {
            self.resume = Some(lower);
            return Ok(false);
        }
        let must_copy = matches!(child, Child::Disk(p) if (self.rewrite_node)(p));
        let node = child_node(child, level, self.src)?;
        // First find out, without copying, whether anything below changes.
        let mut changed = must_copy;
        let mut scratch = (*node).clone();
        match &mut scratch {
            Node::Leaf(leaf) => {
                // Values may change size: the leaf's size is counted anew.
                let mut entries = std::mem::take(leaf).into_entries();
                for (k, v) in entries.iter_mut() {
                    if self.from.is_some_and(|f| *k < *f) {
                        continue;
                    }
                    match (self.rewrite_value)(k, v)? {
                        Visit::Unchanged => {}
                        Visit::Changed => changed = true,
                        Visit::Stop => {
                            self.resume = Some(*k);
                            break;
                        }
                    }
                }
                *leaf = Leaf::new(entries);
            }
            Node::Inner(level, children) => {
                let mut child_freed = Vec::new();
                let n = children.len();
                for i in 0..n {
                    // Wholly below `from`: the next child starts at or before it.
                    if let Some(f) = self.from {
                        if i + 1 < n && children[i + 1].0 <= *f {
                            continue;
                        }
                    }
                    // The first child is unbounded below: it starts where its parent does.
                    let child_lower = if i == 0 { lower } else { children[i].0 };
                    let (_, c) = &mut children[i];
                    changed |= self.node(c, *level - 1, child_lower, &mut child_freed)?;
                }
                freed.extend(child_freed);
            }
        }
        if changed {
            if let Child::Disk(p) = child {
                freed.push(p.clone());
            }
            *self.budget = self.budget.saturating_sub(scratch.mem_bytes());
            *child = Child::Mem(Arc::new(scratch));
        }
        Ok(changed)
    }
}

// ---------------------------------------------------------------------------
// Serialization (inside the AEAD; see docs/FORMAT.md §Nodes)

const F_SAME_OID: u8 = 1;
const F_SAME_KIND: u8 = 2;
const F_NEXT_OFF: u8 = 4;
const F_NEXT_ADDR: u8 = 8;
/// A cell entry followed by its holes (format 4).
const F_HOLES: u8 = 16;
/// A cell whose key reference is an index (format 5): a varint of its first
/// 8 bytes, the other 24 being zero — what the keyed hash forest and the
/// key storage area store (a leaf index, a position) instead of a key.
const F_SHORT_KEY: u8 = 32;
const KNOWN_FLAGS: u8 = F_SAME_OID | F_SAME_KIND | F_NEXT_OFF | F_NEXT_ADDR | F_HOLES | F_SHORT_KEY;

fn put_key_ref(w: &mut Writer, k: &KeyRef) {
    w.raw(k.expose());
}
fn get_key_ref(r: &mut Reader) -> Result<KeyRef, DecodeError> {
    Ok(KeyRef::from_bytes(r.array()?))
}

/// The index a key reference stands for, if it is one (all but its first
/// 8 bytes zero); a random 32-byte key is not, but for a chance of 2^-192.
fn short_key(k: &KeyRef) -> Option<u64> {
    let bytes = k.expose();
    bytes[8..]
        .iter()
        .all(|&b| b == 0)
        .then(|| u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")))
}

fn short_key_ref(index: u64) -> KeyRef {
    let mut bytes = [0u8; oubli_crypto::KEY_REF_LEN];
    bytes[..8].copy_from_slice(&index.to_le_bytes());
    KeyRef::from_bytes(bytes)
}

/// A cell's holes: `varint n`, then per hole `varint gap` (from the end of
/// the previous hole, or from 0) and `varint length`.
pub(crate) fn put_holes(w: &mut Writer, holes: &[(u32, u32)]) {
    w.varint(holes.len() as u64);
    let mut at = 0;
    for &(a, b) in holes {
        w.varint((a - at) as u64);
        w.varint((b - a) as u64);
        at = b;
    }
}

/// Reads holes written by [`put_holes`], checking that they are sorted,
/// disjoint, non-empty and inside the stored range `[start, end)`.
pub(crate) fn get_holes(r: &mut Reader, start: u32, end: u32) -> Result<Holes, DecodeError> {
    let n = r.varint()? as usize;
    if n > crate::holes::MAX_HOLES {
        return Err(DecodeError("hole count"));
    }
    let mut holes = Holes::with_capacity(n);
    let mut at: u64 = 0;
    for i in 0..n {
        let a = at + r.varint()?;
        let b = a + r.varint()?;
        if (i > 0 && a <= at) || b <= a || a < start as u64 || b > end as u64 {
            return Err(DecodeError("hole"));
        }
        holes.push((a as u32, b as u32));
        at = b;
    }
    Ok(holes)
}

/// Serializes a node whose children are all on the medium.
pub fn encode_node(node: &Node) -> Vec<u8> {
    let mut w = Writer::with_capacity(node.approx_size());
    w.u8(node.level());
    w.varint(node.len() as u64);
    match node {
        Node::Leaf(entries) => {
            let mut prev: Option<(Key, Addr)> = None;
            for (k, v) in entries {
                let mut flags = 0;
                if let Some((pk, _)) = prev {
                    if pk.oid == k.oid {
                        flags |= F_SAME_OID;
                    }
                    if pk.kind == k.kind {
                        flags |= F_SAME_KIND;
                    }
                    if pk.off.checked_add(1) == Some(k.off) {
                        flags |= F_NEXT_OFF;
                    }
                }
                if let (Value::Cell(c), Some((_, next_addr))) = (v, prev) {
                    if c.addr == next_addr {
                        flags |= F_NEXT_ADDR;
                    }
                }
                if matches!(v, Value::Cell(c) if !c.holes.is_empty()) {
                    flags |= F_HOLES;
                }
                if matches!(v, Value::Cell(c) if short_key(&c.key).is_some()) {
                    flags |= F_SHORT_KEY;
                }
                w.u8(flags);
                if flags & F_SAME_OID == 0 {
                    w.varint(k.oid);
                }
                if flags & F_SAME_KIND == 0 {
                    w.u8(k.kind);
                }
                if flags & F_NEXT_OFF == 0 {
                    w.varint(k.off);
                }
                let mut next_addr = 0;
                match v {
                    Value::Object(r) => {
                        w.varint(r.size);
                        w.bytes(&r.meta);
                    }
                    Value::Cell(c) => {
                        w.varint(c.start as u64);
                        w.varint(c.len as u64);
                        if flags & F_NEXT_ADDR == 0 {
                            w.varint(c.addr);
                        }
                        match short_key(&c.key) {
                            Some(index) => w.varint(index),
                            None => put_key_ref(&mut w, &c.key),
                        }
                        if !c.holes.is_empty() {
                            put_holes(&mut w, &c.holes);
                        }
                        next_addr = c.addr + c.sealed_len();
                    }
                    Value::Names(b) => {
                        w.varint(b.entries.len() as u64);
                        for (name, target) in &b.entries {
                            w.bytes(name);
                            w.varint(*target);
                        }
                    }
                    Value::Share(id) => w.varint(*id as u64),
                    Value::CellSize(size) => w.varint(*size as u64),
                }
                debug_assert_eq!(v.kind(), k.kind);
                prev = Some((*k, next_addr));
            }
        }
        Node::Inner(_, children) => {
            for (k, c) in children {
                w.varint(k.oid);
                w.u8(k.kind);
                w.varint(k.off);
                let Child::Disk(p) = c else {
                    panic!("encode_node: children must be persisted first");
                };
                w.varint(p.addr);
                w.varint(p.len as u64);
                put_key_ref(&mut w, &p.key);
            }
        }
    }
    w.buf
}

pub fn decode_node(bytes: &[u8]) -> Result<Node, DecodeError> {
    let mut r = Reader::new(bytes);
    let level = r.u8()?;
    let count = r.varint()? as usize;
    if count > bytes.len() {
        return Err(DecodeError("entry count"));
    }
    let node = if level == 0 {
        let mut entries = Vec::with_capacity(count);
        let mut prev: Option<(Key, Addr)> = None;
        for _ in 0..count {
            let flags = r.u8()?;
            if flags & !KNOWN_FLAGS != 0 {
                return Err(DecodeError("unknown entry flags"));
            }
            let need_prev = flags & (F_SAME_OID | F_SAME_KIND | F_NEXT_OFF | F_NEXT_ADDR) != 0;
            if need_prev && prev.is_none() {
                return Err(DecodeError("delta without predecessor"));
            }
            let (pk, paddr) = prev.unwrap_or((Key::MIN, 0));
            let oid = if flags & F_SAME_OID != 0 {
                pk.oid
            } else {
                r.varint()?
            };
            let kind = if flags & F_SAME_KIND != 0 {
                pk.kind
            } else {
                r.u8()?
            };
            let off = if flags & F_NEXT_OFF != 0 {
                pk.off
                    .checked_add(1)
                    .ok_or(DecodeError("offset overflow"))?
            } else {
                r.varint()?
            };
            let key = Key { oid, kind, off };
            let mut next_addr = 0;
            let value = match kind {
                KIND_OBJECT => Value::Object(ObjectRecord {
                    size: r.varint()?,
                    meta: r.bytes()?.to_vec(),
                }),
                KIND_CELL => {
                    let start = u32::try_from(r.varint()?).map_err(|_| DecodeError("start"))?;
                    let len = u32::try_from(r.varint()?).map_err(|_| DecodeError("len"))?;
                    let addr = if flags & F_NEXT_ADDR != 0 {
                        paddr
                    } else {
                        r.varint()?
                    };
                    let key = if flags & F_SHORT_KEY != 0 {
                        short_key_ref(r.varint()?)
                    } else {
                        get_key_ref(&mut r)?
                    };
                    let holes = if flags & F_HOLES != 0 {
                        get_holes(
                            &mut r,
                            start,
                            start.checked_add(len).ok_or(DecodeError("len"))?,
                        )?
                    } else {
                        Holes::new()
                    };
                    let c = CellRef {
                        start,
                        len,
                        addr,
                        key,
                        holes,
                    };
                    next_addr = c.addr + c.sealed_len();
                    Value::Cell(c)
                }
                KIND_NAMES => {
                    let n = r.varint()? as usize;
                    if n > bytes.len() {
                        return Err(DecodeError("bucket size"));
                    }
                    let mut entries = Vec::with_capacity(n);
                    for _ in 0..n {
                        let name = r.bytes()?.to_vec();
                        entries.push((name, r.varint()?));
                    }
                    Value::Names(NameBucket { entries })
                }
                KIND_SHARE => {
                    Value::Share(u32::try_from(r.varint()?).map_err(|_| DecodeError("share id"))?)
                }
                KIND_CELLS => Value::CellSize(
                    u32::try_from(r.varint()?)
                        .ok()
                        .filter(|s| crate::superblock::valid_cell_size(*s))
                        .ok_or(DecodeError("cell size"))?,
                ),
                _ => return Err(DecodeError("unknown entry kind")),
            };
            if let Some((pk, _)) = prev {
                if pk >= key {
                    return Err(DecodeError("keys out of order"));
                }
            }
            prev = Some((key, next_addr));
            entries.push((key, value));
        }
        Node::Leaf(Leaf::new(entries))
    } else {
        let mut children = Vec::with_capacity(count);
        for _ in 0..count {
            let key = Key {
                oid: r.varint()?,
                kind: r.u8()?,
                off: r.varint()?,
            };
            let addr = r.varint()?;
            let len = u32::try_from(r.varint()?).map_err(|_| DecodeError("node len"))?;
            children.push((
                key,
                Child::Disk(NodePtr {
                    addr,
                    len,
                    key: get_key_ref(&mut r)?,
                }),
            ));
        }
        Node::Inner(level, children)
    };
    if !r.is_empty() {
        return Err(DecodeError("trailing bytes"));
    }
    Ok(node)
}

/// Bytes a cell entry takes in a leaf in the common sequential case (for the overhead report).
pub fn cell_entry_len(c: &CellRef) -> usize {
    1 + varint_len(c.start as u64) + varint_len(c.len as u64) + 32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_key_references_are_stored_short_and_read_back_whole() {
        let cell = |key: KeyRef| {
            Value::Cell(CellRef {
                start: 0,
                len: 4096,
                addr: 1 << 32,
                key,
                holes: Vec::new(),
            })
        };
        let index = short_key_ref(1 << 40);
        let random = KeyRef::from_bytes([0xa5; 32]);
        let short = Node::leaf(vec![(Key::new(7, KIND_CELL, 0), cell(index.clone()))]);
        let long = Node::leaf(vec![(Key::new(7, KIND_CELL, 0), cell(random.clone()))]);
        let (s, l) = (encode_node(&short), encode_node(&long));
        assert!(
            s.len() + 24 <= l.len(),
            "{} against {} bytes",
            s.len(),
            l.len()
        );
        for (bytes, key) in [(s, index), (l, random)] {
            let Node::Leaf(entries) = decode_node(&bytes).unwrap() else {
                panic!("a leaf")
            };
            assert_eq!(entries[0].1, cell(key));
        }
    }

    /// Every node of these trees is in memory: nothing is loaded.
    struct NothingOnMedium;
    impl NodeSource for NothingOnMedium {
        fn load(&self, _: &NodePtr, _: u8) -> Result<Arc<Node>> {
            unreachable!("an in-memory tree loads nothing")
        }
    }

    /// Checks every leaf's kept size and heap memory against its entries
    /// summed anew.
    fn check_sizes(child: &Child) -> usize {
        let Child::Mem(node) = child else {
            unreachable!("in memory")
        };
        match &**node {
            Node::Leaf(leaf) => {
                assert_eq!(
                    leaf.size,
                    Leaf::new(leaf.to_vec()).size,
                    "a leaf's kept size"
                );
                let heap: usize = leaf.iter().map(|(_, v)| v.heap_bytes()).sum();
                assert_eq!(leaf.heap, heap, "a leaf's kept heap memory");
                1
            }
            Node::Inner(_, children) => children.iter().map(|(_, c)| check_sizes(c)).sum(),
        }
    }

    #[test]
    fn a_leaf_keeps_its_size_and_memory_through_inserts_replacements_removals_splits_and_merges() {
        // Values of many sizes (holes, metadata), inserted, replaced by
        // larger and smaller ones and removed in a scrambled order, so that
        // leaves split and merge along the way.
        let value = |i: u64, round: u64| match (i + round) % 3 {
            0 => Value::Object(ObjectRecord {
                size: i,
                meta: vec![7; ((i * 7 + round) % 90) as usize],
            }),
            _ => Value::Cell(CellRef {
                start: 0,
                len: 4096,
                addr: i << 20,
                key: KeyRef::from_bytes([(i % 251) as u8 + 1; 32]),
                holes: (0..(i + round) % 5)
                    .map(|h| (h as u32 * 100, h as u32 * 100 + 10))
                    .collect(),
            }),
        };
        let scrambled = |n: u64| (0..n).map(move |i| (i * 7919) % n);
        let mut tree = Tree::default();
        let mut freed = Vec::new();
        let n = 4000;
        for round in 0..3 {
            for i in scrambled(n) {
                tree.insert(
                    Key::new(i, KIND_OBJECT, 0),
                    value(i, round),
                    &NothingOnMedium,
                    &mut freed,
                )
                .unwrap();
            }
            let (root, _) = tree.root.as_ref().unwrap();
            assert!(check_sizes(root) > 10, "the leaves split");
        }
        for i in scrambled(n).filter(|i| i % 5 != 0) {
            tree.remove(&Key::new(i, KIND_OBJECT, 0), &NothingOnMedium, &mut freed)
                .unwrap();
        }
        let (root, _) = tree.root.as_ref().unwrap();
        let leaves = check_sizes(root);
        assert!(leaves < 60, "the leaves merged: {leaves}");
    }

    #[test]
    fn a_decoded_node_is_counted_by_its_memory_not_its_sealed_size() {
        // A leaf of object records, as a store of small files holds.
        let entries = (0..300)
            .map(|oid| {
                let record = ObjectRecord {
                    size: 100,
                    meta: b"file".to_vec(),
                };
                (Key::new(oid, KIND_OBJECT, 0), Value::Object(record))
            })
            .collect();
        let encoded = encode_node(&Node::leaf(entries));
        let decoded = decode_node(&encoded).unwrap();
        let mem = decoded.mem_bytes();
        // What the node cache counted before: it held several times its limit.
        assert!(
            mem > 4 * encoded.len(),
            "{mem} bytes in memory, {} sealed",
            encoded.len()
        );
    }
}
