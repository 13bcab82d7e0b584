//! The upload side (scan and pack) and the staging side (checking a tree
//! that arrived without an archive, swapping it into place).

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use sandhost_archive::{
    check_staged, pack, pack_tree, scan_tree, swap_into_place, unpack, ArchiveError, Cap, Kind,
    Limits, Staging, DOWNLOADED_FILE_MODE,
};
use tempfile::TempDir;

fn write(path: &Path, data: &[u8], mode: u32) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, data).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn mkfifo(path: &Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mkfifo");
}

// ---------------------------------------------------------------- scan and pack

#[test]
fn a_packed_tree_unpacks_to_the_same_files_modes_and_links() {
    let tmp = TempDir::new().unwrap();
    let src = tmp.path().join("src");
    write(&src.join("a.txt"), b"alpha", 0o640);
    write(&src.join("bin/run"), b"#!/bin/sh\n", 0o755);
    fs::set_permissions(src.join("bin"), fs::Permissions::from_mode(0o750)).unwrap();
    symlink("bin/run", src.join("run")).unwrap();
    let mut bytes = Vec::new();
    let scan = pack(&src, &Limits::default(), &mut bytes).unwrap();
    assert_eq!(scan.kind(), Kind::Directory);
    assert_eq!((scan.counts().files, scan.counts().bytes), (2, 15));

    let dest = tmp.path().join("dest");
    fs::create_dir(&dest).unwrap();
    let counts = unpack(&bytes[..], &dest, &Limits::default()).unwrap();
    assert_eq!(counts, scan.counts());
    assert_eq!(fs::read(dest.join("a.txt")).unwrap(), b"alpha");
    assert_eq!(mode(&dest.join("a.txt")), 0o640);
    assert_eq!(mode(&dest.join("bin")), 0o750);
    assert_eq!(mode(&dest.join("bin/run")), 0o755);
    assert_eq!(
        fs::read_link(dest.join("run")).unwrap(),
        Path::new("bin/run")
    );
}

#[test]
fn a_tree_with_an_escaping_symlink_is_refused_whole() {
    let tmp = TempDir::new().unwrap();
    let src = tmp.path().join("src");
    write(&src.join("ok.txt"), b"x", 0o644);
    symlink("../../etc", src.join("out")).unwrap();
    let err = scan_tree(&src, &Limits::default()).unwrap_err();
    assert_eq!(err.code(), "E5153");
    let ArchiveError::SourceRejected { path, reason } = err else {
        panic!("{err:?}")
    };
    assert!(path.ends_with("/src/out"), "{path}");
    assert_eq!(reason, "symlink target leaves the tree");
}

#[test]
fn a_tree_with_a_fifo_is_refused_whole() {
    let tmp = TempDir::new().unwrap();
    let src = tmp.path().join("src");
    write(&src.join("ok.txt"), b"x", 0o644);
    mkfifo(&src.join("pipe"));
    let err = scan_tree(&src, &Limits::default()).unwrap_err();
    assert!(
        matches!(&err, ArchiveError::SourceRejected { reason, .. }
            if reason == "not a regular file, directory or symlink"),
        "{err:?}"
    );
}

#[test]
fn the_scan_counts_caps_before_anything_is_packed() {
    let tmp = TempDir::new().unwrap();
    let src = tmp.path().join("src");
    for i in 0..4 {
        write(&src.join(format!("f{i}")), &[b'x'; 400], 0o644);
    }
    let bytes = scan_tree(
        &src,
        &Limits {
            max_bytes: 1000,
            ..Limits::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            bytes,
            ArchiveError::CapExceeded {
                cap: Cap::Bytes,
                limit: 1000
            }
        ),
        "{bytes:?}"
    );
    let entries = scan_tree(
        &src,
        &Limits {
            max_entries: 3,
            ..Limits::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            entries,
            ArchiveError::CapExceeded {
                cap: Cap::Entries,
                limit: 3
            }
        ),
        "{entries:?}"
    );
}

#[test]
fn a_single_file_scans_but_is_not_packed_as_a_tree() {
    let tmp = TempDir::new().unwrap();
    let f = tmp.path().join("f");
    write(&f, b"abc", 0o600);
    let scan = scan_tree(&f, &Limits::default()).unwrap();
    assert_eq!((scan.kind(), scan.mode()), (Kind::File, 0o600));
    assert_eq!((scan.counts().entries, scan.counts().bytes), (1, 3));
    let err = pack_tree(&f, &scan, Vec::new()).unwrap_err();
    assert_eq!(err.code(), "E5153");
}

#[test]
fn a_file_that_shrank_after_the_scan_fails_the_pack() {
    let tmp = TempDir::new().unwrap();
    let src = tmp.path().join("src");
    write(&src.join("f"), &[b'x'; 2000], 0o644);
    let scan = scan_tree(&src, &Limits::default()).unwrap();
    write(&src.join("f"), b"short", 0o644);
    let err = pack_tree(&src, &scan, Vec::new()).unwrap_err();
    assert!(err.to_string().contains("shrank"), "{err}");
}

// ---------------------------------------------------------------- staged trees

#[test]
fn a_staged_tree_with_a_hard_link_is_refused() {
    let tmp = TempDir::new().unwrap();
    let outside = tmp.path().join("outside.txt");
    write(&outside, b"secret", 0o600);
    let payload = tmp.path().join("payload");
    fs::create_dir(&payload).unwrap();
    fs::hard_link(&outside, payload.join("linked")).unwrap();
    let err = check_staged(&payload, Kind::Directory, &Limits::default()).unwrap_err();
    assert!(
        matches!(&err, ArchiveError::Rejected { entry, reason }
            if entry == "linked" && reason == "hard link"),
        "{err:?}"
    );
}

#[test]
fn a_staged_tree_with_a_fifo_or_an_escaping_symlink_is_refused() {
    let tmp = TempDir::new().unwrap();
    let a = tmp.path().join("a");
    fs::create_dir(&a).unwrap();
    mkfifo(&a.join("pipe"));
    let err = check_staged(&a, Kind::Directory, &Limits::default()).unwrap_err();
    assert_eq!(err.code(), "E5150", "{err:?}");

    let b = tmp.path().join("b");
    fs::create_dir(&b).unwrap();
    symlink("..", b.join("up")).unwrap();
    let err = check_staged(&b, Kind::Directory, &Limits::default()).unwrap_err();
    assert!(
        matches!(&err, ArchiveError::Rejected { reason, .. }
            if reason == "symlink target leaves the tree"),
        "{err:?}"
    );
}

#[test]
fn a_staged_tree_loses_special_bits_and_a_staged_file_gets_0644() {
    let tmp = TempDir::new().unwrap();
    let payload = tmp.path().join("payload");
    write(&payload.join("tool"), b"x", 0o4755);
    fs::create_dir(payload.join("shared")).unwrap();
    fs::set_permissions(payload.join("shared"), fs::Permissions::from_mode(0o1777)).unwrap();
    let counts = check_staged(&payload, Kind::Directory, &Limits::default()).unwrap();
    assert_eq!((counts.entries, counts.files, counts.bytes), (2, 1, 1));
    assert_eq!(mode(&payload.join("tool")), 0o755);
    assert_eq!(mode(&payload.join("shared")), 0o777);

    let f = tmp.path().join("file");
    write(&f, b"x", 0o4700);
    check_staged(&f, Kind::File, &Limits::default()).unwrap();
    assert_eq!(mode(&f), DOWNLOADED_FILE_MODE);
    let err = check_staged(&payload, Kind::File, &Limits::default()).unwrap_err();
    assert_eq!(err.code(), "E5150");
}

// ---------------------------------------------------------------- staging and swap

#[test]
fn a_staging_directory_is_private_and_gone_when_dropped() {
    let tmp = TempDir::new().unwrap();
    let staging = Staging::create(tmp.path()).unwrap();
    let dir = staging.path().to_path_buf();
    assert_eq!(mode(&dir), 0o700);
    assert!(dir
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with(".sandhost-transfer-"));
    write(&staging.payload().join("ro/inner"), b"x", 0o400);
    fs::set_permissions(
        staging.payload().join("ro"),
        fs::Permissions::from_mode(0o500),
    )
    .unwrap();
    drop(staging);
    assert!(!dir.exists());
    assert!(names(tmp.path()).is_empty());
}

#[test]
fn a_directory_swaps_in_over_an_old_one_leaving_nothing_aside() {
    let tmp = TempDir::new().unwrap();
    let dest = tmp.path().join("dest");
    write(&dest.join("old.txt"), b"old", 0o644);
    let staging = Staging::create(tmp.path()).unwrap();
    write(&staging.payload().join("new.txt"), b"new", 0o644);
    swap_into_place(&staging.payload(), &dest, Kind::Directory).unwrap();
    drop(staging);
    assert_eq!(names(&dest), vec!["new.txt"]);
    assert_eq!(names(tmp.path()), vec!["dest"]);
}

#[test]
fn a_file_never_replaces_a_directory() {
    let tmp = TempDir::new().unwrap();
    let dest = tmp.path().join("dest");
    write(&dest.join("inside"), b"x", 0o644);
    let staging = Staging::create(tmp.path()).unwrap();
    write(&staging.payload(), b"payload", 0o644);
    let err = swap_into_place(&staging.payload(), &dest, Kind::File).unwrap_err();
    assert_eq!(err.code(), "E5154");
    drop(staging);
    assert_eq!(names(&dest), vec!["inside"]);
    assert_eq!(names(tmp.path()), vec!["dest"]);
}

#[test]
fn a_file_replaces_a_symlink_without_writing_through_it() {
    let tmp = TempDir::new().unwrap();
    let victim = tmp.path().join("victim");
    write(&victim, b"precious", 0o600);
    let dest = tmp.path().join("dest");
    symlink(&victim, &dest).unwrap();
    let staging = Staging::create(tmp.path()).unwrap();
    write(&staging.payload(), b"payload", 0o644);
    swap_into_place(&staging.payload(), &dest, Kind::File).unwrap();
    assert_eq!(fs::read(&victim).unwrap(), b"precious");
    assert!(fs::symlink_metadata(&dest).unwrap().is_file());
    assert_eq!(fs::read(&dest).unwrap(), b"payload");
}
