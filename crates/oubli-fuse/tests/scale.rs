//! Scale: 100,000 files in one directory — created, listed (readdir pages through one listing per open handle), looked up, removed.

mod common;
use common::*;
use std::fs;
use std::time::Instant;

#[test]
fn hundred_thousand_files_in_one_directory() {
    if !fuse_available() {
        return;
    }
    const N: usize = 100_000;
    let m = Mounted::new(mem_store(), default_options());
    let dir = m.path("big");
    fs::create_dir(&dir).unwrap();
    let t = Instant::now();
    std::thread::scope(|s| {
        for part in 0..4 {
            let dir = &dir;
            s.spawn(move || {
                for i in (part..N).step_by(4) {
                    fs::File::create(dir.join(format!("file-{i:06}"))).unwrap();
                }
            });
        }
    });
    let created = t.elapsed();
    let t = Instant::now();
    let mut names: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let listed = t.elapsed();
    names.sort();
    assert_eq!(names.len(), N);
    assert_eq!(names.first().map(String::as_str), Some("file-000000"));
    assert_eq!(names.last().map(String::as_str), Some("file-099999"));
    // A second listing (new handle) sees the same.
    assert_eq!(fs::read_dir(&dir).unwrap().count(), N);
    assert!(fs::metadata(dir.join("file-054321")).unwrap().is_file());
    let t = Instant::now();
    fs::remove_dir_all(&dir).unwrap();
    let removed = t.elapsed();
    assert!(!dir.exists());
    eprintln!("{N} files: create {created:?}, list {listed:?}, remove {removed:?}");
}
