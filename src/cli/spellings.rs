//! The other spellings of `scdlfs mount`'s flags, as users of other FUSE mounts and of
//! fstab expect them:
//! - `-o opt1,opt2=value`, the fstab spelling (underscores or dashes), which the
//!   `mount.scdlfs` helper passes on as it is; options meant for mount(8), systemd or
//!   the kernel (`ro`, `nodev`, `_netdev`, `x-systemd.*`, ...) are dropped;
//! - `SCDLFS_<FLAG>` environment variables (`SCDLFS_CACHE_SIZE=20GiB`), shown in
//!   `--help`; a flag on the command line wins.
//!
//! Both become the ordinary flags before clap checks them, so every spelling gets the
//! same validation and the same messages.

use std::ffi::OsString;

use clap::Command;

/// The subcommand whose flags have these spellings.
const MOUNT: &str = "mount";

/// Flags with no environment spelling: `-o` itself, whose name would collide with the
/// systemd unit's `SCDLFS_OPTIONS`, and clap's own.
const NO_ENVIRONMENT: [&str; 3] = ["options", "help", "version"];

/// fstab options that are for mount(8), systemd or the kernel, not for scdlfs (which
/// mounts read-only in effect, nodev and nosuid whatever they say).
fn is_for_others(option: &str) -> bool {
    const EXACT: [&str; 25] = [
        "defaults",
        "auto",
        "noauto",
        "rw",
        "ro",
        "user",
        "nouser",
        "users",
        "owner",
        "group",
        "_netdev",
        "nofail",
        "exec",
        "noexec",
        "suid",
        "nosuid",
        "dev",
        "nodev",
        "atime",
        "noatime",
        "relatime",
        "norelatime",
        "strictatime",
        "sync",
        "async",
    ];
    EXACT.contains(&option)
        || option == "diratime"
        || option == "nodiratime"
        || option.starts_with("x-")
        || option.starts_with("comment=")
}

/// `cli` with an `SCDLFS_<FLAG>` variable behind every flag of `mount`.
pub fn with_environment(cli: Command) -> Command {
    cli.mut_subcommand(MOUNT, |mount| {
        mount.mut_args(|arg| {
            let id = arg.get_id().as_str();
            if arg.is_positional() || NO_ENVIRONMENT.contains(&id) {
                return arg;
            }
            let name = format!("SCDLFS_{}", id.to_uppercase());
            arg.env(name)
        })
    })
}

/// The flags that `-o` options stand for, in order.
pub fn flags_of_options(options: &[String]) -> Vec<OsString> {
    let mut flags = Vec::new();
    for option in options.iter().flat_map(|o| o.split(',')) {
        let option = option.trim();
        if option.is_empty() || is_for_others(option) {
            continue;
        }
        let (name, value) = match option.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (option, None),
        };
        flags.push(format!("--{}", name.replace('_', "-")).into());
        flags.extend(value.map(OsString::from));
    }
    flags
}

/// `argv` with each `-o OPTS` (also `-oOPTS`, `--options OPTS`, `--options=OPTS`)
/// after the `mount` subcommand replaced by the flags it stands for.
pub fn expand_options(argv: Vec<OsString>) -> Vec<OsString> {
    let mut out = Vec::with_capacity(argv.len());
    let mut args = argv.into_iter();
    let mut in_mount = false;
    while let Some(arg) = args.next() {
        let text = arg.to_string_lossy().into_owned();
        if !in_mount {
            in_mount = text == MOUNT;
            out.push(arg);
            continue;
        }
        let options = if text == "-o" || text == "--options" {
            args.next()
                .map(|value| value.to_string_lossy().into_owned())
        } else if let Some(value) = text.strip_prefix("--options=") {
            Some(value.to_owned())
        } else if let Some(value) = text.strip_prefix("-o").filter(|v| !v.is_empty()) {
            Some(value.to_owned())
        } else {
            out.push(arg);
            continue;
        };
        match options {
            Some(options) => out.extend(flags_of_options(&[options])),
            // A trailing `-o` with no value: leave it for clap to report.
            None => out.push(arg),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{parse_from, Cli, Command as CliCommand};
    use parking_lot::Mutex;

    /// Tests that set SCDLFS_* variables run one at a time: the environment is global.
    static ENVIRONMENT: Mutex<()> = Mutex::new(());

    fn mount_of(argv: &[&str]) -> String {
        let full = std::iter::once("scdlfs")
            .chain(argv.iter().copied())
            .map(OsString::from);
        match parse_from(full) {
            Ok(Cli {
                command: CliCommand::Mount(args),
            }) => format!("{args:?}"),
            Ok(other) => panic!("not a mount: {other:?}"),
            Err(error) => panic!("{argv:?}: {error}"),
        }
    }

    #[test]
    fn every_spelling_makes_the_same_mount_as_the_flags() {
        let _environment = ENVIRONMENT.lock();
        let flags = [
            "mount",
            "s3://b/p",
            "/mnt/x",
            "--cache-size",
            "20GiB",
            "--allow-other",
            "--read-part-size",
            "4MiB",
            "--view",
            "raw",
            "--endpoint-url",
            "http://127.0.0.1:9",
            "--profile",
            "reader",
            "--requester-pays",
            "--force-path-style",
            "--billing-project",
            "lab-42",
            "--key-file",
            "/etc/scdlfs/key.json",
            "-d",
            "--log-format",
            "json",
            "--log-directory",
            "/var/log/scdlfs",
            "--log-max-files",
            "3",
            "--metadata-ttl",
            "5m",
        ];
        let expected = mount_of(&flags);
        let spellings: [&[&str]; 5] = [
            &[
                "mount", "s3://b/p", "/mnt/x", "-o",
                "cache_size=20GiB,allow_other,read-part-size=4MiB,view=raw,endpoint_url=http://127.0.0.1:9,\
                 profile=reader,requester_pays,force_path_style,billing_project=lab-42,\
                 key_file=/etc/scdlfs/key.json,debug,log_format=json,log_directory=/var/log/scdlfs,log_max_files=3,metadata_ttl=5m",
            ],
            &[
                "mount", "s3://b/p", "/mnt/x", "-ocache_size=20GiB,allow_other,nodev,_netdev",
                "--options=read_part_size=4MiB,x-systemd.automount,ro", "--view", "raw",
                "--options", "endpoint_url=http://127.0.0.1:9,profile=reader",
                "-o", "requester-pays,force-path-style,billing-project=lab-42,key-file=/etc/scdlfs/key.json",
                "-d", "-o", "log-format=json,log-directory=/var/log/scdlfs,log-max-files=3", "-ometadata-ttl=5m",
            ],
            &[
                "mount", "s3://b/p", "/mnt/x", "-o", "cache_size=20GiB", "-o", "allow_other",
                "--read-part-size", "4MiB", "-o", "view=raw,endpoint_url=http://127.0.0.1:9",
                "--profile", "reader", "-o", "requester_pays", "--force-path-style",
                "-o", "billing_project=lab-42", "--key-file", "/etc/scdlfs/key.json",
                "-o", "debug", "--log-format", "json", "-o", "log_directory=/var/log/scdlfs",
                "--log-max-files", "3", "--metadata-ttl", "5m",
            ],
            &["mount", "s3://b/p", "/mnt/x", "-o", "defaults,noatime", "--cache-size", "20GiB",
              "--allow-other", "--read-part-size", "4MiB", "--view", "raw",
              "--endpoint-url", "http://127.0.0.1:9", "--profile", "reader", "--requester-pays",
              "--force-path-style", "--billing-project", "lab-42", "--key-file",
              "/etc/scdlfs/key.json", "--debug", "--log-format", "json", "--log-directory",
              "/var/log/scdlfs", "--log-max-files", "3", "-o", "metadata_ttl=5m"],
            &flags,
        ];
        for argv in spellings {
            assert_eq!(mount_of(argv), expected, "{argv:?}");
        }

        let variables = [
            ("SCDLFS_CACHE_SIZE", "20GiB"),
            ("SCDLFS_ALLOW_OTHER", "true"),
            ("SCDLFS_READ_PART_SIZE", "4MiB"),
            ("SCDLFS_VIEW", "raw"),
            ("SCDLFS_ENDPOINT_URL", "http://127.0.0.1:9"),
            ("SCDLFS_PROFILE", "reader"),
            ("SCDLFS_REQUESTER_PAYS", "true"),
            ("SCDLFS_FORCE_PATH_STYLE", "true"),
            ("SCDLFS_BILLING_PROJECT", "lab-42"),
            ("SCDLFS_KEY_FILE", "/etc/scdlfs/key.json"),
            ("SCDLFS_DEBUG", "true"),
            ("SCDLFS_LOG_FORMAT", "json"),
            ("SCDLFS_LOG_DIRECTORY", "/var/log/scdlfs"),
            ("SCDLFS_LOG_MAX_FILES", "3"),
            ("SCDLFS_METADATA_TTL", "5m"),
        ];
        for (name, value) in variables {
            // SAFETY: the only tests that touch SCDLFS_* hold ENVIRONMENT.
            unsafe { std::env::set_var(name, value) };
        }
        let from_environment = mount_of(&["mount", "s3://b/p", "/mnt/x"]);
        // The command line wins over the environment.
        let overridden = mount_of(&["mount", "s3://b/p", "/mnt/x", "--view", "flat"]);
        for (name, _) in variables {
            // SAFETY: as above.
            unsafe { std::env::remove_var(name) };
        }
        assert_eq!(from_environment, expected);
        assert!(overridden.contains("view: Flat"), "{overridden}");
        assert!(expected.contains("metadata_ttl: Some(300s)"), "{expected}");
    }

    #[test]
    fn options_for_others_are_dropped_and_unknown_ones_are_refused() {
        assert_eq!(
            flags_of_options(&[
                "ro,nodev,nosuid,_netdev,nofail,x-systemd.requires=a.service".into()
            ]),
            Vec::<OsString>::new()
        );
        let error = parse_from(
            [
                "scdlfs",
                "mount",
                "s3://b/p",
                "/mnt/x",
                "-o",
                "allow_other,no_such_option=1",
            ]
            .map(OsString::from),
        )
        .unwrap_err();
        assert!(error.to_string().contains("--no-such-option"), "{error}");
    }

    #[test]
    fn help_shows_the_environment_variables() {
        let help = with_environment(<Cli as clap::CommandFactory>::command())
            .find_subcommand_mut(MOUNT)
            .unwrap()
            .render_long_help()
            .to_string();
        for name in [
            "SCDLFS_CACHE_SIZE",
            "SCDLFS_ALLOW_OTHER",
            "SCDLFS_ENDPOINT_URL",
        ] {
            assert!(help.contains(name), "{name} not in help");
        }
        assert!(!help.contains("SCDLFS_OPTIONS"));
    }

    /// docs/usage.md's table of mount options, as the cells of each row.
    fn documented_options() -> Vec<Vec<String>> {
        let usage = include_str!("../../docs/usage.md");
        let section = usage
            .split("\n## Mount options\n")
            .nth(1)
            .expect("docs/usage.md has a \"Mount options\" section");
        let section = section.split("\n## ").next().unwrap();
        section
            .lines()
            .filter(|line| line.starts_with("| `"))
            .map(|line| {
                line.trim_matches('|')
                    .split(" | ")
                    .map(|cell| cell.trim().to_owned())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn the_usage_table_lists_every_mount_option_with_its_spellings_and_default() {
        let mut cli = with_environment(<Cli as clap::CommandFactory>::command());
        let mount = cli.find_subcommand_mut(MOUNT).unwrap();
        let rows = documented_options();
        let mut documented = 0;
        for arg in mount.get_arguments() {
            let id = arg.get_id().as_str();
            if arg.is_positional() || ["help", "version"].contains(&id) {
                continue;
            }
            documented += 1;
            let long = arg.get_long().unwrap();
            let flag = match arg.get_short() {
                Some(short) => format!("`-{short}`, `--{long}`"),
                None => format!("`--{long}`"),
            };
            let row = rows
                .iter()
                .find(|row| row[0] == flag)
                .unwrap_or_else(|| panic!("{flag} is missing from docs/usage.md's table"));
            let (fstab, environment) = match arg.get_env() {
                Some(name) => (
                    format!("`{}`", long.replace('-', "_")),
                    format!("`{}`", name.to_string_lossy()),
                ),
                None => ("—".to_owned(), "—".to_owned()),
            };
            assert_eq!(row[1], fstab, "-o spelling of {flag}");
            assert_eq!(row[2], environment, "variable of {flag}");
            let default = &row[3];
            if !arg.get_action().takes_values() {
                assert!(
                    default.starts_with("off"),
                    "{flag} defaults to off, not {default}"
                );
            } else if let Some(value) = arg.get_default_values().first() {
                let value = format!("`{}`", value.to_string_lossy());
                assert!(
                    default.contains(&value),
                    "{flag} defaults to {value}, not {default}"
                );
            }
            assert_eq!(row.len(), 6, "{flag}: a row has six cells");
        }
        assert_eq!(
            rows.len(),
            documented,
            "docs/usage.md's table has rows for no option"
        );
    }
}
