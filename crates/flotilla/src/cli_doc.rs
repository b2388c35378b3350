//! The command-line reference as Markdown, generated from the clap definitions themselves
//! (`flotilla cli-reference > docs/cli.md`); a test fails when docs/cli.md is stale.

use std::fmt::Write;

use clap::{Arg, ArgAction, Command};

/// The whole reference: every visible command, its usage, and each of its arguments with
/// its help, default and environment variable.
pub(crate) fn markdown(cli: &Command) -> String {
    let mut cli = cli.clone();
    cli.build();
    let mut out = String::new();
    let _ = writeln!(out, "# Command-line reference\n");
    let _ = writeln!(
        out,
        "Generated from the program's own definitions by `flotilla cli-reference > \
         docs/cli.md`; a test fails when this file is stale. `flotilla COMMAND --help` \
         prints the same.\n"
    );
    let mut index = Vec::new();
    collect(&cli, &mut Vec::new(), &mut index);
    for (path, _) in &index {
        let _ = writeln!(out, "- [`{path}`](#{})", anchor(path));
    }
    out.push('\n');
    for (path, cmd) in &index {
        section(&mut out, path, cmd);
    }
    out
}

/// Every visible command with a full path (`flotilla admin tenant add`), depth first.
fn collect<'a>(cmd: &'a Command, names: &mut Vec<String>, out: &mut Vec<(String, &'a Command)>) {
    names.push(cmd.get_name().to_string());
    out.push((names.join(" "), cmd));
    for sub in cmd.get_subcommands() {
        if !sub.is_hide_set() && sub.get_name() != "help" {
            collect(sub, names, out);
        }
    }
    names.pop();
}

/// The anchor GitHub and most renderers give a heading `flotilla admin tenant add`.
fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn section(out: &mut String, path: &str, cmd: &Command) {
    let _ = writeln!(out, "## {path}\n");
    if let Some(about) = cmd.get_long_about().or(cmd.get_about()) {
        let _ = writeln!(out, "{}\n", about.to_string().trim());
    }
    let usage = cmd.clone().render_usage().to_string();
    let usage = usage.trim_start_matches("Usage: ").trim();
    let _ = writeln!(out, "```text\n{usage}\n```\n");
    // Global options are listed once, under `flotilla`.
    let top = !path.contains(' ');
    let args: Vec<&Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter(|a| top || !a.is_global_set())
        .filter(|a| !matches!(a.get_action(), ArgAction::Help | ArgAction::Version))
        .collect();
    if !args.is_empty() {
        let _ = writeln!(out, "| argument | meaning |\n| --- | --- |");
        for a in args {
            let _ = writeln!(out, "| {} | {} |", cell(&name(a)), cell(&meaning(a)));
        }
        out.push('\n');
    }
    let subs: Vec<&Command> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .collect();
    if !subs.is_empty() {
        let _ = writeln!(out, "Subcommands:\n");
        for s in subs {
            let full = format!("{path} {}", s.get_name());
            let about = s.get_about().map(|a| a.to_string()).unwrap_or_default();
            let _ = writeln!(out, "- [`{full}`](#{}): {}", anchor(&full), about.trim());
        }
        out.push('\n');
    }
}

/// `--cpus <CPUS>`, `-f, --follow`, `<JOB>`.
fn name(a: &Arg) -> String {
    let value = a
        .get_value_names()
        .and_then(|v| v.first())
        .map(|v| v.to_string())
        .unwrap_or_else(|| a.get_id().to_string().to_uppercase());
    let takes_value = matches!(a.get_action(), ArgAction::Set | ArgAction::Append);
    if a.is_positional() {
        return if a.is_required_set() {
            format!("`<{value}>`")
        } else {
            format!("`[{value}]`")
        };
    }
    let mut s = String::new();
    if let Some(c) = a.get_short() {
        s.push_str(&format!("-{c}, "));
    }
    if let Some(l) = a.get_long() {
        s.push_str(&format!("--{l}"));
    }
    if takes_value {
        s.push_str(&format!(" <{value}>"));
    }
    format!("`{s}`")
}

fn meaning(a: &Arg) -> String {
    let mut s = a
        .get_long_help()
        .or(a.get_help())
        .map(|h| h.to_string().trim().to_string())
        .unwrap_or_default();
    if !s.is_empty() && !s.ends_with(['.', '!', '?', ')']) {
        s.push('.');
    }
    let values: Vec<String> = a
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| v.get_name().to_string())
        .collect();
    let takes_value = matches!(a.get_action(), ArgAction::Set | ArgAction::Append);
    if takes_value && !values.is_empty() {
        s.push_str(&format!(" One of: {}.", values.join(", ")));
    }
    let defaults: Vec<String> = a
        .get_default_values()
        .iter()
        .map(|d| d.to_string_lossy().into_owned())
        .collect();
    if takes_value && !defaults.is_empty() {
        s.push_str(&format!(" Default: `{}`.", defaults.join(",")));
    }
    if let Some(env) = a.get_env() {
        s.push_str(&format!(" Environment: `{}`.", env.to_string_lossy()));
    }
    if a.is_required_set() && !a.is_positional() {
        s.push_str(" Required.");
    }
    s.trim().to_string()
}

/// A table cell: one line, pipes escaped.
fn cell(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// Writes a man page for every visible command into `dir` (`flotilla.1`,
/// `flotilla-admin-tenant-add.1`, ...), as `flotilla man --out DIR` does for the packages;
/// returns the files written.
pub(crate) fn man_pages(
    cli: &Command,
    dir: &std::path::Path,
) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut cli = cli.clone();
    cli.build();
    std::fs::create_dir_all(dir)?;
    let mut index = Vec::new();
    collect(&cli, &mut Vec::new(), &mut index);
    let mut written = Vec::new();
    for (path, cmd) in index {
        let name = path.replace(' ', "-");
        // The page's title is the whole command, as `man flotilla-admin-tenant-add` finds it.
        let page = cmd.clone().name(name.clone()).bin_name(path);
        let mut text = Vec::new();
        clap_mangen::Man::new(page).render(&mut text)?;
        let file = dir.join(format!("{name}.1"));
        std::fs::write(&file, text)?;
        written.push(file);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_visible_command_has_a_man_page() {
        let cli = Command::new("flotilla").about("the runtime").subcommand(
            Command::new("admin")
                .about("administration")
                .subcommand(
                    Command::new("tenant")
                        .about("tenants")
                        .subcommand(Command::new("add").about("Add a tenant")),
                )
                .subcommand(Command::new("secret").hide(true)),
        );
        let dir = tempfile::tempdir().expect("a temporary folder");
        let written = man_pages(&cli, dir.path()).expect("written");
        let names: Vec<String> = written
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        assert_eq!(
            names,
            [
                "flotilla.1",
                "flotilla-admin.1",
                "flotilla-admin-tenant.1",
                "flotilla-admin-tenant-add.1"
            ]
        );
        let page = std::fs::read_to_string(dir.path().join("flotilla-admin-tenant-add.1"))
            .expect("a page");
        assert!(page.contains(".TH flotilla-admin-tenant-add 1"), "{page}");
        assert!(page.contains("Add a tenant"), "{page}");
    }
}
