//! Linux swap to zram, the peer of every paging suite: programs run in a cgroup v1 memory group
//! limited to their local memory, and swap to a zram device.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Linux swap to zram, and a cgroup v1 memory group to run programs in.
#[derive(Debug)]
pub struct Zram {
    cgroup: PathBuf,
}

fn write(path: impl AsRef<Path>, value: impl AsRef<[u8]>) -> Result<()> {
    let path = path.as_ref();
    std::fs::write(path, value).with_context(|| format!("writing {}", path.display()))
}

fn sh(cmd: &str) -> Result<()> {
    let out = Command::new("sh").arg("-c").arg(cmd).output()?;
    if !out.status.success() {
        bail!(
            "`{cmd}` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Zram {
    pub fn start(disksize: u64) -> Result<Zram> {
        let memcg = Path::new("/sys/fs/cgroup/memory");
        if !memcg.join("cgroup.procs").exists() {
            bail!(
                "no cgroup v1 memory controller at {}; {}",
                memcg.display(),
                tidepool_sys::probe::DOCTOR_HINT
            );
        }
        if !Path::new("/sys/block/zram0").exists() {
            sh("modprobe zram").with_context(|| {
                format!(
                    "zram is not available; {}",
                    tidepool_sys::probe::DOCTOR_HINT
                )
            })?;
        }
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
        if swaps.contains("/dev/zram0") {
            sh("swapoff /dev/zram0")?;
        }
        write("/sys/block/zram0/reset", "1")?;
        write("/sys/block/zram0/disksize", disksize.to_string())?;
        sh("mkswap /dev/zram0 >/dev/null && swapon /dev/zram0").with_context(|| {
            format!(
                "cannot make zram0 swap (needs root); {}",
                tidepool_sys::probe::DOCTOR_HINT
            )
        })?;
        let cgroup = memcg.join(format!("tidepool-bench-{}", std::process::id()));
        std::fs::create_dir_all(&cgroup)
            .with_context(|| format!("cannot create {}", cgroup.display()))?;
        let _ = write(cgroup.join("memory.swappiness"), "100");
        Ok(Zram { cgroup })
    }

    /// How the bytes a program in the group holds are counted.
    pub fn gauge(&self) -> crate::meter::Gauge {
        crate::meter::Gauge::Zram {
            cgroup: self.cgroup.clone(),
            device: PathBuf::from("/sys/block/zram0"),
        }
    }

    /// A command that runs its arguments inside the group, limited to `limit` bytes.
    pub fn command(&self, limit: u64) -> Result<Command> {
        // What the last program left charged to the group (its files' pages) goes, so that
        // the group's usage is this program's.
        let _ = write(self.cgroup.join("memory.force_empty"), "0");
        write(self.cgroup.join("memory.limit_in_bytes"), limit.to_string())?;
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec \"$@\"",
                self.cgroup.display()
            ))
            .arg("sh");
        Ok(c)
    }
}

impl Drop for Zram {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.cgroup);
        let _ = sh("swapoff /dev/zram0");
        let _ = write("/sys/block/zram0/reset", "1");
    }
}
