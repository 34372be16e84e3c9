//! Smoke test: mount, write, read, unmount.
mod common;
use common::*;

#[test]
fn write_read_unmount() {
    if !fuse_available() {
        return;
    }
    let mut m = Mounted::new(mem_store(), default_options());
    std::fs::write(m.path("hello"), b"world").unwrap();
    assert_eq!(std::fs::read(m.path("hello")).unwrap(), b"world");
    std::fs::create_dir(m.path("d")).unwrap();
    std::fs::write(m.path("d/x"), vec![7u8; 100_000]).unwrap();
    let names: Vec<_> = std::fs::read_dir(&m.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    m.unmount();
}
