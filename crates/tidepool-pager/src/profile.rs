//! Profiles: the section policies chosen for one program (by `tidepool tune`, or by hand), in
//! a file that `tidepool run --profile` applies.
//!
//! A profile is TOML, versioned, and names what it is for: the program's file name and the
//! build id its linker wrote (`.note.gnu.build-id`). It applies only to a process running that
//! very build: any other program, or another build of the same one, ignores it, since its
//! section names (call sites as `module!symbol` or `module+offset`) may mean other code there.
//! Sections are named as `--stats` prints them; a section the profile does not name keeps the
//! default policy, and a named section the run never makes changes nothing.
//!
//! ```toml
//! version = 1
//!
//! [program]
//! name = "python3.11"
//! build_id = "3c1e...f2"
//!
//! [[section]]
//! name = "mmap libpython3.11.so.1.0+0x1ac7fd"
//! prefetch = "own"   # "shared" (the default), "own", "sweep", "successor" or "off"
//! line = 1           # pages read together on a miss: 1, 2, 4, 8 or 16
//! keep = "high"      # "normal" (the default), "high" or "pin" (see `Keep`)
//! share = 20         # the most of the budget its pages may hold, in percent (see `Policy`)
//! ```

use crate::sections::{Keep, Policy, Prefetch, LINE_MAX};
use crate::Pager;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The format this build reads and writes.
pub const VERSION: u32 = 1;

/// Why a profile cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProfileError {
    #[error("cannot read the profile {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the profile {path} is not a profile: {why}")]
    Parse { path: String, why: String },
    #[error(
        "the profile {path} is version {found}, and this tidepool reads version {VERSION} \
         (tune the program again with this tidepool)"
    )]
    Version { path: String, found: u32 },
    #[error("the profile {path}: section {section:?}: {why}")]
    Section {
        path: String,
        section: String,
        why: String,
    },
}

/// A program a profile is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Program {
    /// The file name of the executable (`/proc/self/exe` of the process it runs in).
    pub name: String,
    /// Its build id in hex, if its linker wrote one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
}

impl Program {
    /// The program in the file `path` (symbolic links followed).
    pub fn of_file(path: &Path) -> std::io::Result<Program> {
        let path = std::fs::canonicalize(path)?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let build_id = tidepool_sys::exec_static::build_id(&path)?
            .map(|id| id.iter().map(|b| format!("{b:02x}")).collect());
        Ok(Program { name, build_id })
    }

    /// The program this process runs, read through `/proc/self/exe`: named as its file was
    /// when it started, and its build id read from the image that runs, even after the file was
    /// replaced (an upgrade, a rebuild) and the link reads `PATH (deleted)`.
    pub fn of_this_process() -> std::io::Result<Program> {
        let link = Path::new("/proc/self/exe");
        let build_id = tidepool_sys::exec_static::build_id(link)?
            .map(|id| id.iter().map(|b| format!("{b:02x}")).collect());
        Ok(Program {
            name: exe_name(&std::fs::read_link(link)?),
            build_id,
        })
    }
}

/// The file name of an executable as `/proc/PID/exe` links it, without the ` (deleted)` the
/// kernel appends once the file was replaced: a running service keeps its name through an
/// upgrade of its package.
pub fn exe_name(link: &Path) -> String {
    let name = link
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match name.strip_suffix(" (deleted)") {
        Some(kept) if !kept.is_empty() => kept.to_string(),
        _ => name,
    }
}

/// How a profile relates to a program.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fit {
    /// The same build: the profile applies.
    Applies,
    /// Another build of a program of the same name: its call sites may have moved.
    OtherBuild,
    /// Another program.
    OtherProgram,
}

/// A section's policy as written in a profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SectionEntry {
    /// As `--stats` names it.
    pub name: String,
    #[serde(default)]
    pub prefetch: PrefetchName,
    #[serde(default = "one")]
    pub line: u8,
    #[serde(default, skip_serializing_if = "KeepName::is_normal")]
    pub keep: KeepName,
    /// The most of the budget its pages may hold, in percent (0, the default: no limit).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub share: u8,
    /// Why the tuner chose this, for the reader (ignored when applied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

fn one() -> u8 {
    1
}

fn is_zero(n: &u8) -> bool {
    *n == 0
}

/// [`Prefetch`] as a profile spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum PrefetchName {
    #[default]
    Shared,
    Own,
    Sweep,
    Successor,
    Off,
}

impl From<PrefetchName> for Prefetch {
    fn from(p: PrefetchName) -> Prefetch {
        match p {
            PrefetchName::Shared => Prefetch::Shared,
            PrefetchName::Own => Prefetch::Own,
            PrefetchName::Sweep => Prefetch::Sweep,
            PrefetchName::Successor => Prefetch::Successor,
            PrefetchName::Off => Prefetch::Off,
        }
    }
}

impl From<Prefetch> for PrefetchName {
    fn from(p: Prefetch) -> PrefetchName {
        match p {
            Prefetch::Own => PrefetchName::Own,
            Prefetch::Sweep => PrefetchName::Sweep,
            Prefetch::Successor => PrefetchName::Successor,
            Prefetch::Off => PrefetchName::Off,
            _ => PrefetchName::Shared,
        }
    }
}

/// [`Keep`] as a profile spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum KeepName {
    #[default]
    Normal,
    High,
    Pin,
}

impl KeepName {
    fn is_normal(&self) -> bool {
        *self == KeepName::Normal
    }
}

impl From<KeepName> for Keep {
    fn from(k: KeepName) -> Keep {
        match k {
            KeepName::Normal => Keep::Normal,
            KeepName::High => Keep::High,
            KeepName::Pin => Keep::Pin,
        }
    }
}

impl From<Keep> for KeepName {
    fn from(k: Keep) -> KeepName {
        match k {
            Keep::High => KeepName::High,
            Keep::Pin => KeepName::Pin,
            _ => KeepName::Normal,
        }
    }
}

/// A profile: a program and its sections' policies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub version: u32,
    pub program: Program,
    /// How it was made, for the reader (ignored when applied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuned: Option<String>,
    #[serde(default, rename = "section")]
    pub sections: Vec<SectionEntry>,
}

impl Profile {
    /// An empty profile (every section on the default policy) for `program`.
    pub fn new(program: Program) -> Profile {
        Profile {
            version: VERSION,
            program,
            tuned: None,
            sections: Vec::new(),
        }
    }

    /// Reads and checks the profile in `path`.
    pub fn read(path: &Path) -> Result<Profile, ProfileError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Read {
            path: shown.clone(),
            source,
        })?;
        Profile::parse(&text, &shown)
    }

    /// Parses and checks a profile's text (`path` names it in errors).
    pub fn parse(text: &str, path: &str) -> Result<Profile, ProfileError> {
        // The version first, so that a newer format is reported as such, not as a bad field.
        #[derive(Deserialize)]
        struct Versioned {
            version: u32,
        }
        let parse = |why: String| ProfileError::Parse {
            path: path.to_string(),
            why,
        };
        let v: Versioned = toml::from_str(text).map_err(|e| parse(e.message().to_string()))?;
        if v.version != VERSION {
            return Err(ProfileError::Version {
                path: path.to_string(),
                found: v.version,
            });
        }
        let p: Profile = toml::from_str(text).map_err(|e| parse(e.to_string()))?;
        for s in &p.sections {
            let bad = |why: &str| ProfileError::Section {
                path: path.to_string(),
                section: s.name.clone(),
                why: why.to_string(),
            };
            if !s.line.is_power_of_two() || s.line > LINE_MAX {
                return Err(bad(&format!(
                    "line {} is not one of 1, 2, 4, 8, 16",
                    s.line
                )));
            }
            if s.name.is_empty() || s.name.chars().any(char::is_control) {
                return Err(bad("a section name is text on one line"));
            }
        }
        Ok(p)
    }

    /// The profile as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a profile always serialises")
    }

    /// How this profile relates to `program`.
    pub fn fit(&self, program: &Program) -> Fit {
        if self.program.name != program.name {
            Fit::OtherProgram
        } else if self.program.build_id != program.build_id {
            Fit::OtherBuild
        } else {
            Fit::Applies
        }
    }

    /// Gives each section the profile names its policy in `pager` (naming the sections now,
    /// so that pages named later take them). Returns how many sections it set.
    pub fn apply(&self, pager: &Pager) -> usize {
        for s in &self.sections {
            let id = pager.section(&s.name);
            pager.set_section_policy(
                id,
                Policy::new(s.prefetch.into(), s.line)
                    .keeping(s.keep.into())
                    .sharing(s.share),
            );
        }
        self.sections.len()
    }
}

/// What one process's sections did in a run, as `tidepool tune` reads it: written at exit by
/// each process `tidepool run` started with `TIDEPOOL_RUN_SECTIONS_OUT=DIR`, to
/// `DIR/sections-PID.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Observed {
    pub program: Program,
    #[serde(default, rename = "section")]
    pub sections: Vec<ObservedSection>,
}

/// One section's counters in [`Observed`] (see [`crate::SectionStats`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObservedSection {
    pub name: String,
    pub faults: u64,
    pub far_reads: u64,
    pub evicted: u64,
    pub prefetched: u64,
    pub used: u64,
    /// Pages read along with misses for the section's line.
    #[serde(default)]
    pub line_pages: u64,
    pub prefetch: PrefetchName,
    pub line: u8,
    #[serde(default, skip_serializing_if = "KeepName::is_normal")]
    pub keep: KeepName,
    /// Its reuse distances ([`crate::SectionStats::refetched`]), trailing empty buckets left
    /// out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refetched: Vec<u64>,
}

impl ObservedSection {
    /// Far reads of pages evicted fewer than `bytes` bytes of evictions before.
    pub fn refetched_within(&self, bytes: u64) -> u64 {
        crate::sections::refetched_within(&self.refetched, bytes)
    }
}

impl Observed {
    /// What `pager`'s sections did so far, in the program `program`.
    pub fn of(pager: &Pager, program: Program) -> Observed {
        let sections = pager
            .stats()
            .sections
            .into_iter()
            .map(|s| ObservedSection {
                faults: s.faults,
                far_reads: s.far_fetches,
                evicted: s.evicted,
                prefetched: s.prefetch_planned,
                used: s.prefetch_credited,
                line_pages: s.line_pages,
                prefetch: s.policy.prefetch.into(),
                line: s.policy.line,
                keep: s.policy.keep.into(),
                refetched: {
                    let used = s
                        .refetched
                        .iter()
                        .rposition(|&n| n > 0)
                        .map_or(0, |k| k + 1);
                    s.refetched[..used].to_vec()
                },
                name: s.name,
            })
            .collect();
        Observed { program, sections }
    }

    /// Writes it to `dir/sections-PID.toml`, readable by its owner only.
    pub fn write_to(&self, dir: &Path) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let text = toml::to_string(self).expect("always serialises");
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(dir.join(format!("sections-{}.toml", std::process::id())))?
            .write_all(text.as_bytes())
    }

    /// Every record in `dir`.
    pub fn read_dir(dir: &Path) -> Result<Vec<Observed>, ProfileError> {
        Ok(Observed::read_dir_by_pid(dir)?
            .into_iter()
            .map(|(_, o)| o)
            .collect())
    }

    /// Every record in `dir`, with the pid of the process that wrote it.
    pub fn read_dir_by_pid(dir: &Path) -> Result<Vec<(u32, Observed)>, ProfileError> {
        let mut all = Vec::new();
        let entries = std::fs::read_dir(dir).map_err(|source| ProfileError::Read {
            path: dir.display().to_string(),
            source,
        })?;
        for e in entries.flatten() {
            let path = e.path();
            let pid = path
                .file_stem()
                .and_then(|s| s.to_str())
                .and_then(|s| s.strip_prefix("sections-"))
                .and_then(|p| p.parse().ok());
            if let (Some(pid), true) = (pid, path.extension().is_some_and(|x| x == "toml")) {
                let shown = path.display().to_string();
                let text = std::fs::read_to_string(&path).map_err(|source| ProfileError::Read {
                    path: shown.clone(),
                    source,
                })?;
                let o = toml::from_str(&text).map_err(|e| ProfileError::Parse {
                    path: shown,
                    why: e.to_string(),
                })?;
                all.push((pid, o));
            }
        }
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program() -> Program {
        Program {
            name: "python3.11".into(),
            build_id: Some("abcd".into()),
        }
    }

    #[test]
    fn a_profile_reads_back_what_it_wrote() {
        let mut p = Profile::new(program());
        p.tuned = Some("tidepool tune --local 64M -- python3 t.py".into());
        p.sections.push(SectionEntry {
            name: "mmap libpython3.11.so.1.0+0x1ac7fd".into(),
            prefetch: PrefetchName::Own,
            line: 2,
            keep: KeepName::Normal,
            share: 0,
            why: Some("a stream".into()),
        });
        p.sections.push(SectionEntry {
            name: "heap 48B".into(),
            prefetch: PrefetchName::Off,
            line: 1,
            keep: KeepName::Pin,
            share: 25,
            why: None,
        });
        let text = p.to_toml();
        assert!(text.contains("prefetch = \"own\""), "{text}");
        assert!(text.contains("keep = \"pin\""), "{text}");
        // The default is not written.
        assert_eq!(text.matches("keep =").count(), 1, "{text}");
        assert_eq!(text.matches("share = 25").count(), 1, "{text}");
        assert_eq!(Profile::parse(&text, "p.toml").unwrap(), p);
    }

    #[test]
    fn defaults_fill_what_a_hand_written_profile_leaves_out() {
        let p = Profile::parse(
            "version = 1\n[program]\nname = \"x\"\n[[section]]\nname = \"heap 48B\"\n",
            "p",
        )
        .unwrap();
        assert_eq!(p.sections[0].prefetch, PrefetchName::Shared);
        assert_eq!(p.sections[0].line, 1);
        assert_eq!(p.sections[0].keep, KeepName::Normal);
        assert_eq!(p.program.build_id, None);
    }

    #[test]
    fn bad_profiles_are_refused_with_the_reason() {
        let err = |text: &str| Profile::parse(text, "p.toml").unwrap_err().to_string();
        assert!(err("version = 2\n[program]\nname = \"x\"\n").contains("version 2"));
        assert!(err("not toml at all").contains("not a profile"));
        assert!(err("version = 1\n[program]\nname = \"x\"\nspeed = 11\n").contains("speed"));
        let bad_line =
            "version = 1\n[program]\nname = \"x\"\n[[section]]\nname = \"s\"\nline = 3\n";
        assert!(err(bad_line).contains("line 3"), "{}", err(bad_line));
        let bad_mode = "version = 1\n[program]\nname = \"x\"\n[[section]]\nname = \"s\"\nprefetch = \"psychic\"\n";
        assert!(err(bad_mode).contains("psychic"), "{}", err(bad_mode));
        let bad_keep =
            "version = 1\n[program]\nname = \"x\"\n[[section]]\nname = \"s\"\nkeep = \"forever\"\n";
        assert!(err(bad_keep).contains("forever"), "{}", err(bad_keep));
    }

    #[test]
    fn a_profile_fits_only_its_own_build() {
        let p = Profile::new(program());
        assert_eq!(p.fit(&program()), Fit::Applies);
        let other_build = Program {
            build_id: Some("ef01".into()),
            ..program()
        };
        assert_eq!(p.fit(&other_build), Fit::OtherBuild);
        let other = Program {
            name: "node".into(),
            ..program()
        };
        assert_eq!(p.fit(&other), Fit::OtherProgram);
    }

    #[test]
    fn a_program_file_has_a_name_and_a_build_id() {
        // This test binary: rustc's linker writes a build id.
        let me = Program::of_file(&std::env::current_exe().unwrap()).unwrap();
        assert!(me.name.starts_with("tidepool_pager"), "{me:?}");
        assert!(
            me.build_id.as_ref().is_some_and(|b| b.len() >= 16),
            "{me:?}"
        );
        assert_eq!(Program::of_this_process().unwrap(), me);
    }

    #[test]
    fn a_replaced_executable_keeps_its_name() {
        let name = |link: &str| exe_name(Path::new(link));
        assert_eq!(name("/usr/bin/redis-server (deleted)"), "redis-server");
        assert_eq!(name("/usr/bin/redis-server"), "redis-server");
    }
}
