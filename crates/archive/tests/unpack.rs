//! Unpacking untrusted archives built in memory: what lands, what is
//! refused, and that nothing is written outside the root or before a cap
//! is checked.

use std::cell::Cell;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::rc::Rc;

use sandhost_archive::{unpack, ArchiveError, Cap, Counts, Limits, METADATA_PER_ENTRY};
use tar::EntryType;
use tempfile::TempDir;

// ---------------------------------------------------------------- building archives

/// A GNU header written byte for byte: no path checks, so hostile names go
/// through as they are.
fn header(name: &[u8], kind: EntryType, size: u64, mode: u32, link: &[u8]) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    if kind == EntryType::GNUSparse {
        let gnu = h.as_gnu_mut().unwrap();
        gnu.set_real_size(size);
        gnu.set_is_extended(false);
    }
    h.set_cksum();
    h
}

enum E<'a> {
    File(&'a str, &'a [u8], u32),
    Dir(&'a str, u32),
    Link(&'a str, &'a str),
    Raw(Box<tar::Header>, &'a [u8]),
}

/// A whole archive, with a `./` root entry first and the end marker last.
fn archive(entries: &[E<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    b.append(
        &header(b".", EntryType::Directory, 0, 0o755, b""),
        io::empty(),
    )
    .unwrap();
    for e in entries {
        match e {
            E::File(n, data, mode) => b.append(
                &header(
                    n.as_bytes(),
                    EntryType::Regular,
                    data.len() as u64,
                    *mode,
                    b"",
                ),
                *data,
            ),
            E::Dir(n, mode) => b.append(
                &header(n.as_bytes(), EntryType::Directory, 0, *mode, b""),
                io::empty(),
            ),
            E::Link(n, target) => b.append(
                &header(
                    n.as_bytes(),
                    EntryType::Symlink,
                    0,
                    0o777,
                    target.as_bytes(),
                ),
                io::empty(),
            ),
            E::Raw(h, data) => b.append(h, *data),
        }
        .unwrap();
    }
    b.into_inner().unwrap()
}

struct Sandbox {
    _tmp: TempDir,
    /// The directory that holds `root` and `outside`.
    top: std::path::PathBuf,
}

impl Sandbox {
    fn new() -> Self {
        let tmp = TempDir::new().unwrap();
        let top = tmp.path().to_path_buf();
        fs::create_dir(top.join("root")).unwrap();
        fs::create_dir(top.join("outside")).unwrap();
        Self { _tmp: tmp, top }
    }

    fn root(&self) -> std::path::PathBuf {
        self.top.join("root")
    }

    fn unpack(&self, bytes: &[u8], limits: &Limits) -> Result<Counts, ArchiveError> {
        unpack(bytes, &self.root(), limits)
    }

    /// Nothing appeared next to the root or in `outside`.
    fn assert_contained(&self) {
        assert_eq!(names(&self.top), vec!["outside", "root"]);
        assert!(names(&self.top.join("outside")).is_empty());
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

fn rejection(r: Result<Counts, ArchiveError>) -> (String, String) {
    match r {
        Err(e @ ArchiveError::Rejected { .. }) => {
            assert_eq!(e.code(), "E5150");
            let ArchiveError::Rejected { entry, reason } = e else {
                unreachable!()
            };
            (entry, reason)
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
}

fn refused(entries: &[E<'_>]) -> (String, String) {
    let sb = Sandbox::new();
    let got = rejection(sb.unpack(&archive(entries), &Limits::default()));
    sb.assert_contained();
    got
}

// ---------------------------------------------------------------- what lands

#[test]
fn a_plain_tree_unpacks_with_its_modes_symlinks_and_counts() {
    let sb = Sandbox::new();
    let counts = sb
        .unpack(
            &archive(&[
                E::Dir("d", 0o750),
                E::File("d/a.txt", b"hello", 0o640),
                E::File("deep/er/b", b"xy", 0o600),
                E::Link("l", "d/a.txt"),
            ]),
            &Limits::default(),
        )
        .unwrap();
    assert_eq!(
        counts,
        Counts {
            entries: 4,
            files: 2,
            bytes: 7
        }
    );
    let root = sb.root();
    assert_eq!(fs::read(root.join("d/a.txt")).unwrap(), b"hello");
    assert_eq!(fs::read(root.join("deep/er/b")).unwrap(), b"xy");
    assert_eq!(fs::read_link(root.join("l")).unwrap(), Path::new("d/a.txt"));
    assert_eq!(mode(&root.join("d")), 0o750);
    assert_eq!(mode(&root.join("d/a.txt")), 0o640);
    assert_eq!(mode(&root.join("deep")), 0o755, "implied parents get 0755");
    assert_eq!(mode(&root), 0o755, "the root takes the `./` entry's mode");
}

#[test]
fn setuid_setgid_and_sticky_bits_are_stripped() {
    let sb = Sandbox::new();
    sb.unpack(
        &archive(&[
            E::File("tool", b"#!/bin/sh\n", 0o4755),
            E::File("group", b"g", 0o2750),
            E::Dir("shared", 0o1777),
        ]),
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(mode(&sb.root().join("tool")), 0o755);
    assert_eq!(mode(&sb.root().join("group")), 0o750);
    assert_eq!(mode(&sb.root().join("shared")), 0o777);
}

// ---------------------------------------------------------------- hostile names and links

#[test]
fn a_dotdot_entry_is_rejected_and_nothing_lands_outside() {
    let got = refused(&[
        E::File("ok.txt", b"x", 0o644),
        E::File("../escape.txt", b"x", 0o644),
    ]);
    assert_eq!(got, ("../escape.txt".into(), "`..` in path".into()));
}

#[test]
fn an_absolute_entry_is_rejected() {
    let sb = Sandbox::new();
    let abs = sb.top.join("outside/abs.txt");
    let abs = abs.to_str().unwrap();
    let got = rejection(sb.unpack(&archive(&[E::File(abs, b"x", 0o644)]), &Limits::default()));
    assert_eq!(got, (abs.to_string(), "absolute path".into()));
    sb.assert_contained();
}

#[test]
fn a_symlink_to_etc_then_a_file_through_it_is_rejected() {
    let got = refused(&[E::Link("etc", "/etc"), E::File("etc/canary", b"x", 0o644)]);
    assert_eq!(got, ("etc".into(), "absolute symlink target".into()));
    assert!(!Path::new("/etc/canary").exists());
}

#[test]
fn a_file_through_a_relative_symlink_out_is_rejected() {
    let got = refused(&[
        E::Link("up", "../outside"),
        E::File("up/through.txt", b"x", 0o644),
    ]);
    assert_eq!(
        got,
        (
            "up/through.txt".into(),
            "path goes through a symlink".into()
        )
    );
}

#[test]
fn a_relative_symlink_leaving_the_tree_is_rejected_even_with_nothing_through_it() {
    let got = refused(&[E::Dir("d", 0o755), E::Link("d/up", "../../outside")]);
    assert_eq!(
        got,
        ("d/up".into(), "symlink target leaves the tree".into())
    );
}

#[test]
fn a_symlink_whose_target_climbs_through_another_symlink_is_rejected() {
    // d/l -> .. stays inside; x -> d/l/.. looks inside lexically but
    // resolves to the parent of the tree
    let got = refused(&[
        E::Dir("d", 0o755),
        E::Link("d/l", ".."),
        E::Link("x", "d/l/.."),
    ]);
    assert_eq!(
        got,
        (
            "x".into(),
            "symlink target passes through another symlink".into()
        )
    );
}

#[test]
fn hard_links_devices_fifos_and_sparse_files_are_rejected() {
    for (kind, link, reason) in [
        (EntryType::Link, &b"/etc/passwd"[..], "hard link"),
        (EntryType::Char, b"", "device node"),
        (EntryType::Block, b"", "device node"),
        (EntryType::Fifo, b"", "fifo"),
        (EntryType::GNUSparse, b"", "sparse file"),
    ] {
        let got = refused(&[E::Raw(Box::new(header(b"node", kind, 0, 0o644, link)), b"")]);
        assert_eq!(got, ("node".into(), reason.into()), "{kind:?}");
    }
}

#[test]
fn a_duplicate_entry_is_rejected() {
    let got = refused(&[E::File("a", b"1", 0o644), E::File("a", b"2", 0o644)]);
    assert_eq!(got, ("a".into(), "duplicate entry".into()));
}

#[test]
fn a_name_that_is_not_utf8_is_rejected() {
    let got = refused(&[E::Raw(
        Box::new(header(b"bad\xff", EntryType::Regular, 0, 0o644, b"")),
        b"",
    )]);
    assert_eq!(got.1, "path is not UTF-8");
}

// ---------------------------------------------------------------- caps

#[test]
fn too_many_entries_stop_the_unpack_at_the_cap() {
    let sb = Sandbox::new();
    let names_: Vec<String> = (0..50).map(|i| format!("f{i:03}")).collect();
    let entries: Vec<E<'_>> = names_.iter().map(|n| E::File(n, b"x", 0o644)).collect();
    let err = sb
        .unpack(
            &archive(&entries),
            &Limits {
                max_entries: 10,
                ..Limits::default()
            },
        )
        .unwrap_err();
    assert_eq!(err.code(), "E5151");
    assert!(
        matches!(
            err,
            ArchiveError::CapExceeded {
                cap: Cap::Entries,
                limit: 10
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        names(&sb.root()).len(),
        10,
        "the 11th entry was not written"
    );
    sb.assert_contained();
}

#[test]
fn too_many_bytes_stop_the_unpack_before_the_file_that_crosses_the_cap() {
    let sb = Sandbox::new();
    let data = [b'b'; 600];
    let err = sb
        .unpack(
            &archive(&[
                E::File("f0", &data, 0o644),
                E::File("f1", &data, 0o644),
                E::File("f2", &data, 0o644),
            ]),
            &Limits {
                max_bytes: 1000,
                ..Limits::default()
            },
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            ArchiveError::CapExceeded {
                cap: Cap::Bytes,
                limit: 1000
            }
        ),
        "{err:?}"
    );
    assert_eq!(names(&sb.root()), vec!["f0"]);
}

#[test]
fn a_header_claiming_a_terabyte_is_refused_before_any_byte_is_written() {
    let sb = Sandbox::new();
    let mut bytes = archive(&[]);
    // replace the end marker by a header claiming 1 TiB with nothing behind
    bytes.truncate(512);
    bytes
        .extend_from_slice(header(b"huge.bin", EntryType::Regular, 1 << 40, 0o644, b"").as_bytes());
    bytes.extend_from_slice(&[0; 1024]);
    let err = sb.unpack(&bytes, &Limits::default()).unwrap_err();
    assert!(
        matches!(
            err,
            ArchiveError::CapExceeded {
                cap: Cap::Bytes,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(names(&sb.root()).is_empty(), "huge.bin was never created");
}

// ---------------------------------------------------------------- streaming

/// Yields a tar stream of one file of `len` bytes (a byte pattern), made up
/// on the fly, at most `chunk` bytes per read. At every 8 MiB it measures how
/// far the file on disk lags behind what was handed out.
struct Generated {
    chunk: usize,
    len: u64,
    header: Vec<u8>,
    pos: u64,
    watch: std::path::PathBuf,
    max_lag: u64,
    biggest_read: usize,
}

impl Generated {
    fn total(&self) -> u64 {
        // header, data padded to a block, two zero blocks
        512 + self.len.div_ceil(512) * 512 + 1024
    }

    fn byte_at(&self, pos: u64) -> u8 {
        if pos < 512 {
            return self.header[pos as usize];
        }
        let data = pos - 512;
        if data < self.len {
            pattern(data)
        } else {
            0
        }
    }
}

fn pattern(i: u64) -> u8 {
    (i % 251) as u8
}

impl Read for Generated {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf
            .len()
            .min(self.chunk)
            .min((self.total() - self.pos) as usize);
        for (i, b) in buf[..n].iter_mut().enumerate() {
            *b = self.byte_at(self.pos + i as u64);
        }
        self.biggest_read = self.biggest_read.max(n);
        let before = self.pos;
        self.pos += n as u64;
        if before / (8 << 20) != self.pos / (8 << 20) && self.pos > 512 {
            let on_disk = fs::metadata(&self.watch).map_or(0, |m| m.len());
            self.max_lag = self.max_lag.max(before - 512 - on_disk.min(before - 512));
        }
        Ok(n)
    }
}

#[test]
fn a_64_mib_file_streams_from_a_small_chunk_reader_straight_to_disk() {
    let sb = Sandbox::new();
    let len: u64 = 64 << 20;
    let mut gen = Generated {
        chunk: 4096,
        len,
        header: header(b"big.bin", EntryType::Regular, len, 0o644, b"")
            .as_bytes()
            .to_vec(),
        pos: 0,
        watch: sb.root().join("big.bin"),
        max_lag: 0,
        biggest_read: 0,
    };
    let counts = unpack(&mut gen, &sb.root(), &Limits::default()).unwrap();
    assert_eq!((counts.files, counts.bytes), (1, len));
    assert!(gen.biggest_read <= 4096);
    // written as it arrives: never more than a copy buffer behind the reader
    assert!(gen.max_lag <= 1 << 20, "lag {}", gen.max_lag);
    assert!(gen.max_lag < len);
    let mut f = fs::File::open(sb.root().join("big.bin")).unwrap();
    let mut buf = vec![0; 1 << 20];
    let mut at = 0u64;
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        for (i, b) in buf[..n].iter().enumerate() {
            assert_eq!(*b, pattern(at + i as u64), "byte {}", at + i as u64);
        }
        at += n as u64;
    }
    assert_eq!(at, len);
}

/// Endless bytes after a prefix, counting what was read; gives up (an
/// error) after `give_up` bytes so a failing test cannot hang.
struct Endless {
    prefix: Vec<u8>,
    read: Rc<Cell<u64>>,
    give_up: u64,
}

impl Read for Endless {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let at = self.read.get();
        if at >= self.give_up {
            return Err(io::Error::other("test reader gave up"));
        }
        let n = buf.len().min(64 * 1024);
        for (i, b) in buf[..n].iter_mut().enumerate() {
            *b = self.prefix.get((at as usize) + i).copied().unwrap_or(b'a');
        }
        self.read.set(at + n as u64);
        Ok(n)
    }
}

#[test]
fn a_long_name_header_claiming_a_terabyte_is_refused_after_bounded_reading() {
    let sb = Sandbox::new();
    let mut prefix = archive(&[]);
    prefix.truncate(512);
    prefix.extend_from_slice(
        header(
            b"././@LongLink",
            EntryType::GNULongName,
            1 << 40,
            0o644,
            b"",
        )
        .as_bytes(),
    );
    let read = Rc::new(Cell::new(0));
    let r = unpack(
        Endless {
            prefix,
            read: read.clone(),
            give_up: 256 << 20,
        },
        &sb.root(),
        &Limits::default(),
    );
    let (entry, reason) = rejection(r);
    assert_eq!(entry, "<archive>");
    assert!(reason.contains("metadata"), "{reason}");
    assert!(
        read.get() <= METADATA_PER_ENTRY + 2048,
        "read {}",
        read.get()
    );
}

#[test]
fn a_stream_cut_short_on_a_block_boundary_is_not_taken_for_a_smaller_tree() {
    let sb = Sandbox::new();
    let mut bytes = archive(&[E::File("a", b"1", 0o644), E::File("b", b"2", 0o644)]);
    // `./`, `a` with its data block; `b` and the end marker are missing
    bytes.truncate(512 * 3);
    let got = rejection(sb.unpack(&bytes, &Limits::default()));
    assert_eq!(
        got,
        (
            "<archive>".into(),
            "archive ends without its end-of-archive marker".into()
        )
    );
}

#[test]
fn a_failing_reader_is_a_read_error_not_a_rejection() {
    let sb = Sandbox::new();
    let mut prefix = archive(&[E::File("a", &[b'z'; 4096], 0o644)]);
    prefix.truncate(512 * 2 + 1000);
    let len = prefix.len() as u64;
    let err = unpack(
        Endless {
            prefix,
            read: Rc::new(Cell::new(0)),
            give_up: len,
        },
        &sb.root(),
        &Limits::default(),
    )
    .unwrap_err();
    assert_eq!(err.code(), "E5155", "{err:?}");
    assert!(err.to_string().contains("test reader gave up"), "{err}");
}
