//! Capability paths against their fallbacks, measured side by side in one
//! run through the same provider:
//! - native sync vs the base64-over-exec fallback on one tree (MB/s, ratio);
//! - time to the first output byte: streaming vs polling vs run-once.
//!
//! Usage: paths-bench [--provider local|python] [--mib 64] [--runs 5]
//! (run from the workspace root after `cargo build --release --workspace --bins`).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use sandhost_contract::manifest::parse_manifest;
use sandhost_contract::resolve::LeasePolicy;
use sandhost_contract::template::Template;
use sandhost_contract::ProviderCapability as Cap;
use sandhost_runtime::exec::{exec, ExecRequest, OutputSink};
use sandhost_runtime::host::{CreateRequest, Host, HostConfig, Sandbox};
use sandhost_runtime::plugins::{Plugin, PluginSource, Registry};
use sandhost_runtime::transfer::{download, upload, TransferLimits, TransferPath};
use sandhost_runtime::worker::WorkerOptions;

struct Args {
    provider: String,
    mib: u64,
    runs: usize,
}

fn args() -> Result<Args> {
    let mut a = Args {
        provider: "local".into(),
        mib: 64,
        runs: 5,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().with_context(|| format!("{k} needs a value"))?;
        match k.as_str() {
            "--provider" => a.provider = v,
            "--mib" => a.mib = v.parse()?,
            "--runs" => a.runs = v.parse()?,
            _ => bail!("unknown argument {k}"),
        }
    }
    Ok(a)
}

fn plugin(name: &str) -> Result<(Plugin, &'static str)> {
    let exe_dir = std::env::current_exe()?
        .parent()
        .map(Path::to_path_buf)
        .context("no exe dir")?;
    let root = std::env::current_dir()?;
    match name {
        "python" => Ok((
            Plugin::load(&root.join("examples/python-provider"), PluginSource::Flag)
                .map_err(|e| anyhow::anyhow!("{e}"))?,
            "python-tempdir",
        )),
        "local" => {
            let text = std::fs::read_to_string(root.join("providers/local/plugin.json"))
                .context("run from the workspace root")?;
            let manifest = parse_manifest(&text)?;
            Ok((
                Plugin {
                    dir: exe_dir,
                    manifest,
                    source: PluginSource::Builtin,
                },
                "local",
            ))
        }
        other => bail!("unknown provider {other} (local or python)"),
    }
}

async fn open(plugin: &Plugin, home: &Path) -> Result<Host> {
    let registry = Registry::discover(&[], None, vec![plugin.clone()]);
    Ok(Host::open(HostConfig {
        home: home.into(),
        registry,
        worker_options: WorkerOptions::default(),
    })
    .await?)
}

async fn sandbox(h: &Host, driver: &str) -> Result<Sandbox> {
    Ok(h.create(CreateRequest {
        template: Template::builtin(),
        template_yaml: "name: default\n".into(),
        provider: Some(driver.into()),
        config: serde_json::json!({"resources": {"diskBytes": 2u64 << 30, "memoryBytes": 2u64 << 30}}),
        ttl: Some(Duration::from_secs(3600)),
        policy: LeasePolicy::Ephemeral,
    })
    .await?)
}

fn make_tree(root: &Path, mib: u64) -> Result<u64> {
    let files = mib.max(1);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..files {
        let d = root.join(format!("d{}", i % 8));
        std::fs::create_dir_all(&d)?;
        let mut buf = vec![0u8; 1 << 20];
        for b in buf.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        std::fs::write(d.join(format!("f{i}.bin")), &buf)?;
    }
    Ok(files << 20)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn mbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64()
}

/// Upload then download the tree once; the two durations and the path.
async fn sync_once(
    s: &Sandbox,
    tree: &Path,
    scratch: &Path,
) -> Result<(Duration, Duration, TransferPath)> {
    let limits = TransferLimits {
        max_bytes: 4 << 30,
        ..TransferLimits::default()
    };
    let t = Instant::now();
    let up = upload(&s.ctx, tree, "bench-tree", &limits).await?;
    let up_t = t.elapsed();
    let dest = scratch.join(format!("back-{}", Instant::now().elapsed().as_nanos()));
    let t = Instant::now();
    download(&s.ctx, "bench-tree", &dest, &limits).await?;
    let down_t = t.elapsed();
    std::fs::remove_dir_all(&dest)?;
    Ok((up_t, down_t, up.path))
}

struct FirstByte {
    start: Instant,
    first: Option<Duration>,
}

impl OutputSink for FirstByte {
    fn stdout(&mut self, chunk: &str) {
        if self.first.is_none() && !chunk.is_empty() {
            self.first = Some(self.start.elapsed());
        }
    }
    fn stderr(&mut self, _: &str) {}
}

async fn first_byte(s: &Sandbox) -> Result<(Duration, String)> {
    let req = ExecRequest {
        argv: vec![
            "sh".into(),
            "-c".into(),
            "echo first; sleep 1; echo second".into(),
        ],
        ..ExecRequest::default()
    };
    let mut sink = FirstByte {
        start: Instant::now(),
        first: None,
    };
    let o = exec(&s.ctx, &req, &mut sink).await?;
    Ok((
        sink.first.context("no output")?,
        format!("{:?}", o.output_path),
    ))
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = args()?;
    let (plugin, driver) = plugin(&a.provider)?;
    let tmp = tempfile::tempdir()?;
    let tree = tmp.path().join("tree");
    let bytes = make_tree(&tree, a.mib)?;

    // ---- native sync vs base64 fallback, same provider, same tree
    let native = open(&plugin, &tmp.path().join("home-native")).await?;
    let fallback = open(
        &plugin.narrowed(driver, Cap::NativeSyncIn),
        &tmp.path().join("home-fallback"),
    )
    .await?;
    let (sn, sf) = (
        sandbox(&native, driver).await?,
        sandbox(&fallback, driver).await?,
    );
    if !sn.ctx.snapshot.native_sync() {
        bail!(
            "provider {} does not have native sync effective; nothing to compare",
            a.provider
        );
    }
    let (mut nu, mut nd, mut fu, mut fd) = (vec![], vec![], vec![], vec![]);
    for _ in 0..a.runs {
        let (u, d, p) = sync_once(&sn, &tree, tmp.path()).await?;
        assert_eq!(p, TransferPath::Native);
        nu.push(u);
        nd.push(d);
        let (u, d, p) = sync_once(&sf, &tree, tmp.path()).await?;
        assert_eq!(p, TransferPath::Base64Fallback);
        fu.push(u);
        fd.push(d);
    }
    let (nu, nd, fu, fd) = (median(nu), median(nd), median(fu), median(fd));
    println!(
        "sync of a {} MiB tree ({} files) through `{}`, median of {} runs:",
        a.mib,
        a.mib.max(1),
        driver,
        a.runs
    );
    println!(
        "  upload    native {:8.1} MB/s   base64 fallback {:8.1} MB/s   native/fallback {:6.1}x",
        mbps(bytes, nu),
        mbps(bytes, fu),
        fu.as_secs_f64() / nu.as_secs_f64()
    );
    println!(
        "  download  native {:8.1} MB/s   base64 fallback {:8.1} MB/s   native/fallback {:6.1}x",
        mbps(bytes, nd),
        mbps(bytes, fd),
        fd.as_secs_f64() / nd.as_secs_f64()
    );
    let (n, f) = (nu + nd, fu + fd);
    println!("  round trip native {:7.2} s   fallback {:7.2} s   native/fallback {:6.1}x (target >= 10x)", n.as_secs_f64(), f.as_secs_f64(), f.as_secs_f64() / n.as_secs_f64());
    native.destroy(&sn).await?;
    fallback.destroy(&sf).await?;
    native.shutdown().await;
    fallback.shutdown().await;

    // ---- time to first output byte: stream vs poll vs once
    let variants: Vec<(&str, Plugin)> = vec![
        ("stream", plugin.clone()),
        (
            "without incremental output",
            plugin.narrowed(driver, Cap::IncrementalSessionOutput),
        ),
        (
            "without incremental output or control commands",
            plugin
                .narrowed(driver, Cap::IncrementalSessionOutput)
                .narrowed(driver, Cap::IndependentControlCommands),
        ),
    ];
    println!(
        "time to first output byte of `echo first; sleep 1; echo second`, median of {} runs:",
        a.runs
    );
    let mut base = None;
    for (i, (label, p)) in variants.into_iter().enumerate() {
        let h = open(&p, &tmp.path().join(format!("home-fb-{i}"))).await?;
        let s = sandbox(&h, driver).await?;
        let mut v = vec![];
        let mut path = String::new();
        for _ in 0..a.runs {
            let (d, pth) = first_byte(&s).await?;
            v.push(d);
            path = pth;
        }
        let m = median(v);
        let b = *base.get_or_insert(m);
        println!(
            "  {:<48} path {:<6} {:8.1} ms   vs stream {:6.1}x",
            label,
            path,
            m.as_secs_f64() * 1e3,
            m.as_secs_f64() / b.as_secs_f64()
        );
        h.destroy(&s).await?;
        h.shutdown().await;
    }
    Ok(())
}
