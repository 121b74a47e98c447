//! Shell completions and man pages, made from the command-line definitions themselves, so they
//! never drift from `--help` (clap_complete, clap_mangen).

use anyhow::{Context, Result};
use clap::CommandFactory;
use std::path::Path;

/// `tidepool completions SHELL`: the shell's completion script, on standard output.
pub fn completions(shell: clap_complete::Shell) -> Result<()> {
    let mut cmd = crate::Cli::command();
    clap_complete::generate(shell, &mut cmd, "tidepool", &mut std::io::stdout());
    Ok(())
}

/// `tidepool manpages DIR`: tidepool.1, and tidepool-COMMAND.1 for each command users run.
pub fn man_pages(out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot make {}", out.display()))?;
    let mut cmd = crate::Cli::command();
    cmd.build();
    write_page(out, "tidepool", cmd.clone())?;
    // Not clap's own `help` command: `tidepool.1` and each page say what --help does.
    let commands = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help");
    for sub in commands {
        let name = format!("tidepool-{}", sub.get_name());
        let page = sub
            .clone()
            .display_name(name.clone())
            .version(env!("CARGO_PKG_VERSION"));
        write_page(out, &name, page)?;
    }
    Ok(())
}

/// Renders one page as `DIR/NAME.1`.
fn write_page(out: &Path, name: &str, cmd: clap::Command) -> Result<()> {
    let path = out.join(format!("{name}.1"));
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd)
        .render(&mut page)
        .with_context(|| format!("cannot render {name}.1"))?;
    std::fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))
}
