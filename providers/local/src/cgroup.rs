//! Host-side cgroup management, for cgroup v1 (one hierarchy per controller)
//! and v2 (unified), detected from /proc/self/mountinfo.
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::LocalError;

pub const CONTROLLERS: &[&str] = &["memory", "pids", "cpu"];

/// Where each controller lives on this host.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    /// v1 mount point per controller.
    pub v1: Vec<(String, PathBuf)>,
    /// The cgroup2 mount and the controllers it offers.
    pub v2: Option<(PathBuf, Vec<String>)>,
}

impl Layout {
    pub fn detect() -> Layout {
        let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        Layout::parse(&info, |mnt| {
            fs::read_to_string(mnt.join("cgroup.controllers")).unwrap_or_default()
        })
    }

    /// Parse mountinfo text; `controllers` reads a cgroup2 mount's cgroup.controllers.
    pub fn parse(info: &str, controllers: impl Fn(&Path) -> String) -> Layout {
        let mut layout = Layout::default();
        for line in info.lines() {
            let Some((pre, post)) = line.split_once(" - ") else {
                continue;
            };
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            if pre.len() < 5 || post.len() < 3 {
                continue;
            }
            let mnt = PathBuf::from(pre[4]);
            match post[0] {
                "cgroup" => {
                    for opt in post[2].split(',') {
                        if CONTROLLERS.contains(&opt) && !layout.v1.iter().any(|(c, _)| c == opt) {
                            layout.v1.push((opt.to_string(), mnt.clone()));
                        }
                    }
                }
                "cgroup2" if layout.v2.is_none() => {
                    let ctrls = controllers(&mnt);
                    let ctrls = ctrls.split_whitespace().map(str::to_string).collect();
                    layout.v2 = Some((mnt, ctrls));
                }
                _ => {}
            }
        }
        layout
    }

    /// How `controller` is provided: v1 first (hybrid hosts), else v2.
    pub fn locate(&self, controller: &str) -> Option<Placement> {
        if let Some((_, p)) = self.v1.iter().find(|(c, _)| c == controller) {
            return Some(Placement::V1(p.clone()));
        }
        if let Some((root, ctrls)) = &self.v2 {
            if ctrls.iter().any(|c| c == controller) {
                return Some(Placement::V2(root.clone()));
            }
        }
        None
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    V1(PathBuf),
    V2(PathBuf),
}

/// Limits written into the sandbox's cgroups.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub memory_bytes: u64,
    pub pids: u64,
    pub cpu_millis: u64,
}

/// The cgroup directories of one sandbox (persisted in the state dir).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SandboxCgroup {
    /// (controller, directory, is_v2)
    pub dirs: Vec<(String, PathBuf, bool)>,
}

fn write(path: &Path, value: &str) -> Result<(), LocalError> {
    fs::write(path, value)
        .map_err(|e| LocalError::Cgroup(format!("write {value:?} to {}: {e}", path.display())))
}

impl SandboxCgroup {
    /// Create `sandhost/<id>` under each controller and apply the limits.
    pub fn create(layout: &Layout, id: &str, limits: Limits) -> Result<SandboxCgroup, LocalError> {
        let mut cg = SandboxCgroup::default();
        let mut v2_dir: Option<PathBuf> = None;
        for ctrl in CONTROLLERS {
            let placement = layout
                .locate(ctrl)
                .ok_or_else(|| LocalError::NoCgroupController(ctrl.to_string()))?;
            match placement {
                Placement::V1(mnt) => {
                    let dir = mnt.join("sandhost").join(id);
                    fs::create_dir_all(&dir)
                        .map_err(|e| LocalError::Cgroup(format!("mkdir {}: {e}", dir.display())))?;
                    cg.dirs.push((ctrl.to_string(), dir, false));
                }
                Placement::V2(root) => {
                    let parent = root.join("sandhost");
                    let dir = parent.join(id);
                    if v2_dir.is_none() {
                        let _ = fs::create_dir_all(&parent);
                        let enable: String = CONTROLLERS
                            .iter()
                            .filter(|c| matches!(layout.locate(c), Some(Placement::V2(_))))
                            .map(|c| format!("+{c} "))
                            .collect();
                        let _ = fs::write(root.join("cgroup.subtree_control"), enable.trim());
                        let _ = fs::write(parent.join("cgroup.subtree_control"), enable.trim());
                        fs::create_dir_all(&dir).map_err(|e| {
                            LocalError::Cgroup(format!("mkdir {}: {e}", dir.display()))
                        })?;
                        v2_dir = Some(dir.clone());
                    }
                    cg.dirs.push((ctrl.to_string(), dir, true));
                }
            }
        }
        let res = cg.apply(limits);
        if res.is_err() {
            cg.remove(Duration::from_millis(100));
        }
        res.map(|_| cg)
    }

    fn apply(&self, l: Limits) -> Result<(), LocalError> {
        for (ctrl, dir, v2) in &self.dirs {
            match (ctrl.as_str(), v2) {
                ("memory", false) => {
                    write(
                        &dir.join("memory.limit_in_bytes"),
                        &l.memory_bytes.to_string(),
                    )?;
                    let sw = dir.join("memory.memsw.limit_in_bytes");
                    if sw.exists() {
                        write(&sw, &l.memory_bytes.to_string())?;
                    }
                    let _ = fs::write(dir.join("memory.swappiness"), "0");
                }
                ("memory", true) => {
                    write(&dir.join("memory.max"), &l.memory_bytes.to_string())?;
                    let sw = dir.join("memory.swap.max");
                    if sw.exists() {
                        write(&sw, "0")?;
                    }
                }
                ("pids", _) => write(&dir.join("pids.max"), &l.pids.to_string())?,
                ("cpu", false) => {
                    write(&dir.join("cpu.cfs_period_us"), "100000")?;
                    write(
                        &dir.join("cpu.cfs_quota_us"),
                        &(l.cpu_millis * 100).to_string(),
                    )?;
                }
                ("cpu", true) => write(
                    &dir.join("cpu.max"),
                    &format!("{} 100000", l.cpu_millis * 100),
                )?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Distinct `cgroup.procs` files to join (one per v1 hierarchy, one for v2).
    pub fn procs_files(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self
            .dirs
            .iter()
            .map(|(_, d, _)| d.join("cgroup.procs"))
            .collect();
        v.dedup();
        v
    }

    fn dir(&self, ctrl: &str) -> Option<&(String, PathBuf, bool)> {
        self.dirs.iter().find(|(c, _, _)| c == ctrl)
    }

    fn key_value(path: &Path, key: &str) -> Option<u64> {
        let text = fs::read_to_string(path).ok()?;
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok()).flatten()
        })
    }

    /// Number of OOM kills so far in this cgroup.
    pub fn oom_kills(&self) -> u64 {
        match self.dir("memory") {
            Some((_, d, false)) => Self::key_value(&d.join("memory.oom_control"), "oom_kill"),
            Some((_, d, true)) => Self::key_value(&d.join("memory.events"), "oom_kill"),
            None => None,
        }
        .unwrap_or(0)
    }

    /// Number of times a fork was refused by pids.max.
    pub fn pids_limited(&self) -> u64 {
        self.dir("pids")
            .and_then(|(_, d, _)| Self::key_value(&d.join("pids.events"), "max"))
            .unwrap_or(0)
    }

    /// Current number of tasks counted by the pids controller.
    pub fn pids_current(&self) -> u64 {
        self.dir("pids")
            .and_then(|(_, d, _)| fs::read_to_string(d.join("pids.current")).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Pids currently in the sandbox's cgroups.
    pub fn procs(&self) -> Vec<i32> {
        let mut all = vec![];
        for f in self.procs_files() {
            if let Ok(t) = fs::read_to_string(&f) {
                all.extend(t.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
        }
        all.sort_unstable();
        all.dedup();
        all
    }

    /// Kill everything in the cgroups (cgroup.kill on v2, else signal every
    /// listed pid until none is left).
    pub fn kill_all(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        for (_, d, v2) in &self.dirs {
            if *v2 {
                let _ = fs::write(d.join("cgroup.kill"), "1");
            }
        }
        loop {
            let procs = self.procs();
            if procs.is_empty() {
                return true;
            }
            for p in procs {
                let _ = crate::sys::kill(p, crate::sys::SIGKILL);
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Kill and remove every directory; true when nothing is left.
    pub fn remove(&self, timeout: Duration) -> bool {
        self.kill_all(timeout);
        let deadline = Instant::now() + timeout;
        let mut ok = true;
        for (_, d, _) in &self.dirs {
            loop {
                match fs::remove_dir(d) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(2))
                    }
                    Err(_) => {
                        ok = false;
                        break;
                    }
                }
            }
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
37 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const V2: &str = "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";

    #[test]
    fn hybrid_host_uses_v1_hierarchies() {
        let l = Layout::parse(HYBRID, |_| String::new());
        assert_eq!(
            l.locate("memory"),
            Some(Placement::V1("/sys/fs/cgroup/memory".into()))
        );
        assert_eq!(
            l.locate("cpu"),
            Some(Placement::V1("/sys/fs/cgroup/cpu,cpuacct".into()))
        );
        assert_eq!(
            l.locate("pids"),
            Some(Placement::V1("/sys/fs/cgroup/pids".into()))
        );
    }

    #[test]
    fn unified_host_uses_v2_when_the_controller_is_offered() {
        let l = Layout::parse(V2, |_| "cpuset cpu io memory pids".into());
        assert_eq!(
            l.locate("memory"),
            Some(Placement::V2("/sys/fs/cgroup".into()))
        );
        let l = Layout::parse(V2, |_| "cpu io".into());
        assert_eq!(l.locate("memory"), None);
    }
}
