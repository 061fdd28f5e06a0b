//! A terminal program under a real terminal: a tmux server of its own (a socket named after
//! [`unique_tag`], so tests never share one), a detached session of a fixed size running one
//! command, its screen read with `capture-pane` and keys sent with `send-keys`. The server is
//! killed and its socket file removed on drop.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::netns::unique_tag;

/// One tmux server with one session.
pub struct Tmux {
    socket: String,
    /// The server's socket file, removed on drop (tmux leaves it behind).
    socket_path: Option<PathBuf>,
    /// Where the command's exit code is written when it ends.
    exit_file: PathBuf,
}

impl Tmux {
    /// Starts `argv` (shell-quoted here) in a detached `width`×`height` session; its exit code
    /// goes to a file ([`Tmux::wait_exit`]) and its stderr to `stderr`.
    ///
    /// # Errors
    ///
    /// When tmux is missing (`cargo xtask setup` installs it) or the session does not start.
    pub fn start(argv: &[&str], stderr: &std::path::Path, width: u16, height: u16) -> Result<Self> {
        let socket = format!("sy-{}", unique_tag());
        let exit_file = std::env::temp_dir().join(format!("{socket}.exit"));
        let _ = std::fs::remove_file(&exit_file);
        let quoted: Vec<String> = argv.iter().map(|a| quote(a)).collect();
        let script = format!(
            "{} 2>{}; echo $? >{}",
            quoted.join(" "),
            quote(&stderr.display().to_string()),
            quote(&exit_file.display().to_string())
        );
        let mut t = Self {
            socket,
            socket_path: None,
            exit_file,
        };
        t.tmux(&[
            "new-session",
            "-d",
            "-x",
            &width.to_string(),
            "-y",
            &height.to_string(),
            "sh",
            "-c",
            &script,
        ])
        .context("starting tmux (apt-get install tmux; `cargo xtask setup` does)")?;
        t.socket_path = t
            .tmux(&["display-message", "-p", "#{socket_path}"])
            .ok()
            .map(|p| PathBuf::from(p.trim()));
        Ok(t)
    }

    fn tmux(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("tmux")
            .args(["-L", &self.socket, "-f", "/dev/null"])
            .args(args)
            .output()?;
        if !out.status.success() {
            bail!(
                "tmux {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The visible screen, one line per row.
    ///
    /// # Errors
    ///
    /// When the session is gone (the command ended).
    pub fn screen(&self) -> Result<String> {
        self.tmux(&["capture-pane", "-p"])
    }

    /// Polls the screen every 50 ms until `pred` holds, up to `limit`; the screen and the time
    /// it took.
    ///
    /// # Errors
    ///
    /// When `pred` does not hold within `limit` (the error carries the last screen).
    pub fn wait_screen(
        &self,
        limit: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Result<(String, Duration)> {
        let start = Instant::now();
        let mut last = String::new();
        loop {
            if let Ok(s) = self.screen() {
                if pred(&s) {
                    return Ok((s, start.elapsed()));
                }
                last = s;
            }
            if start.elapsed() > limit {
                bail!("the screen did not show it within {limit:?}; last screen:\n{last}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends keys (tmux key names: `q`, `Escape`, `C-c`).
    ///
    /// # Errors
    ///
    /// When the session is gone.
    pub fn send_keys(&self, keys: &str) -> Result<()> {
        self.tmux(&["send-keys", keys]).map(drop)
    }

    /// Waits up to `limit` for the command to end; its exit code.
    ///
    /// # Errors
    ///
    /// When it has not ended within `limit`, or its code cannot be read.
    pub fn wait_exit(&self, limit: Duration) -> Result<i32> {
        let start = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(&self.exit_file)
                && text.ends_with('\n')
            {
                return text
                    .trim()
                    .parse()
                    .with_context(|| format!("exit code {text:?}"));
            }
            if start.elapsed() > limit {
                bail!(
                    "still running after {limit:?}; screen:\n{}",
                    self.screen().unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `s` quoted for `sh`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-server"]);
        let _ = std::fs::remove_file(&self.exit_file);
        if let Some(p) = &self.socket_path {
            let _ = std::fs::remove_file(p);
        }
    }
}
