//! Starting a supervised command so that it never outlives its supervisor.
//!
//! `lock run`, `job run` and `election run` run a command only while a lease is held. When the
//! `redquorum` process dies without a chance to stop the command (`kill -9`, the OOM killer, a
//! panic that aborts), the lease expires and another host starts its own command: the old one
//! must be gone by then. Two mechanisms, each covering what the other cannot:
//!
//! - **The parent-death signal** (Linux only): the command is started with
//!   `PR_SET_PDEATHSIG = SIGKILL`, set in the child between fork and exec, so the kernel kills
//!   it the moment the supervisor dies. It covers the direct child only: the signal is not
//!   inherited by the command's own children (`sh -c 'a | b'` forks `a` and `b`).
//! - **The group guard** (every Unix): a tiny `/bin/sh` process that leads the command's
//!   process group, ignores SIGTERM/SIGINT/SIGHUP and blocks reading a pipe whose only writer
//!   is the supervisor. When the supervisor dies the kernel closes the pipe; the guard reads
//!   end-of-file and sends SIGKILL to its whole process group (the command, its children and
//!   itself). When the command ends normally the supervisor writes a line instead, and the
//!   guard exits without killing anything. Because the guard leads the group, the group's ID
//!   stays allocated as long as the guard lives: its SIGKILL can never reach an unrelated
//!   group that reused the number.
//!
//! What neither covers: a command's child that leaves the group (`setsid`, `setpgid`, a daemon
//! that double-forks) escapes both; a guard killed on its own (by someone else's `kill -9`)
//! leaves the direct child to the parent-death signal only; on platforms without the
//! parent-death signal (macOS, the BSDs) the group guard alone stands between the command and
//! an orphaned run.

use std::io::{self, Write};
use std::sync::{mpsc, OnceLock};

use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

/// The guard's script: ignore the signals a graceful stop sends the group, say it is ready
/// (so no SIGTERM reaches it before the trap is set), then kill the whole group at
/// end-of-file on stdin (the supervisor died) and exit quietly at a line (dismissed).
const GUARD_SCRIPT: &str = "trap '' TERM INT HUP; echo; read -r line || kill -9 0";

/// A command started by [`spawn`]: the command itself and the guard of its process group.
#[derive(Debug)]
pub(crate) struct Tethered {
    /// The command.
    pub(crate) child: Child,
    /// The command's process group (the guard's pid, or the command's own without a guard).
    pub(crate) pgid: Pid,
    guard: Option<Guard>,
}

/// The group guard: its process, and the write end of the pipe it watches.
#[derive(Debug)]
struct Guard {
    process: Child,
    /// Dropped with the supervisor: the guard then reads end-of-file.
    line: io::PipeWriter,
}

impl Tethered {
    /// After the command ended (and anything the supervisor meant to kill was killed): tell
    /// the guard to stand down, and reap it. Leftovers of the command's group that the
    /// supervisor did not kill are left alone from here on, as a command's background
    /// children always were when it exited by itself.
    pub(crate) async fn release(mut self) {
        if let Some(mut guard) = self.guard.take() {
            // A guard already killed with the group (SIGKILL) makes this write fail: nothing
            // to dismiss then.
            let _ = guard.line.write_all(b"\n");
            drop(guard.line);
            let _ = guard.process.wait().await;
        }
    }
}

/// Start `command` (its program, arguments and environment set) tethered to this process: in
/// a process group led by a group guard, with the parent-death signal on Linux (see the
/// module's documentation). The command is forked on a thread that lives as long as the
/// process ([`fork_thread`]).
///
/// Errors: the guard or the command could not be started (the command then never ran).
pub(crate) async fn spawn(mut command: Command) -> io::Result<Tethered> {
    let switches = Switches::read();
    let guard = if switches.group_guard {
        Some(start_guard().await?)
    } else {
        None
    };
    let group = guard
        .as_ref()
        .and_then(|g| g.process.id())
        .map_or(0, |id| id as i32);
    command.process_group(group).kill_on_drop(true);
    #[cfg(target_os = "linux")]
    if switches.parent_death_signal {
        die_with_this_process(&mut command);
    }
    let child = fork_on_lasting_thread(command).await?;
    let pgid = match (group, child.id()) {
        (0, Some(id)) => Pid::from_raw(id as i32),
        (g, _) => Pid::from_raw(g),
    };
    Ok(Tethered { child, pgid, guard })
}

/// Start the group guard in a process group of its own, and wait until it ignores the
/// signals a graceful stop sends.
async fn start_guard() -> io::Result<Guard> {
    let (watched, line) = io::pipe()?;
    let mut command = Command::new("/bin/sh");
    command
        .args(["-c", GUARD_SCRIPT])
        .stdin(watched)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .process_group(0);
    // The write end is close-on-exec (std's pipes are): the guard and the command do not hold
    // it, so end-of-file comes exactly when this process dies (or drops it).
    let mut process = command.spawn()?;
    let mut ready = [0u8; 1];
    if let Some(stdout) = process.stdout.as_mut() {
        stdout.read_exact(&mut ready).await?;
    }
    drop(process.stdout.take());
    Ok(Guard { process, line })
}

/// Set `PR_SET_PDEATHSIG = SIGKILL` in the child before exec, and give up (the spawn fails)
/// if this process already died before that: the child would then be an orphan, adopted by
/// init or a subreaper, which the signal no longer concerns.
#[cfg(target_os = "linux")]
fn die_with_this_process(command: &mut Command) {
    use nix::sys::prctl::set_pdeathsig;
    use nix::sys::signal::Signal;
    use nix::unistd::{getpid, getppid};

    let supervisor = getpid();
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe operations are allowed. It makes two system calls (prctl, getppid)
    // through nix's thin wrappers, compares two integers, and builds an `io::Error` from a raw
    // OS error code (no allocation); it takes no lock, allocates nothing and touches no state
    // shared with other threads.
    unsafe {
        command.pre_exec(move || {
            set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
            if getppid() != supervisor {
                // The supervisor died between fork and prctl: the signal will never come.
                return Err(io::Error::from(nix::errno::Errno::ESRCH));
            }
            Ok(())
        });
    }
}

/// A spawn run on [`fork_thread`].
type Job = Box<dyn FnOnce() + Send>;

/// Spawn `command` on [`fork_thread`], within the current Tokio runtime.
async fn fork_on_lasting_thread(mut command: Command) -> io::Result<Child> {
    let runtime = tokio::runtime::Handle::current();
    let (reply, spawned) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _entered = runtime.enter();
        let _ = reply.send(command.spawn());
    });
    fork_thread()?
        .send(job)
        .map_err(|_| io::Error::other("the thread that starts commands is gone"))?;
    spawned
        .await
        .map_err(|_| io::Error::other("the thread that starts commands dropped the spawn"))?
}

/// The thread every supervised command is forked from: started on first use and never ended
/// (its channel's sender lives in a static).
///
/// Why a thread of its own: the parent-death signal fires when the *thread* that forked the
/// child exits, not the process. Tokio's blocking-pool threads end after idling, and a runtime
/// worker that ran `block_in_place` can become one; a command forked on such a thread would be
/// killed while its supervisor still runs, or (had the signal been left off) go on after it.
/// The main thread would do too, but only as long as no caller moves the supervision into a
/// spawned task; this thread does not depend on where the caller runs.
fn fork_thread() -> io::Result<&'static mpsc::Sender<Job>> {
    static FORKER: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    if let Some(sender) = FORKER.get() {
        return Ok(sender);
    }
    let (sender, jobs) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("redquorum-fork".into())
        .spawn(move || {
            // Runs until the process exits: the static sender is never dropped. (A thread
            // started by a racing first call whose sender lost `get_or_init` ends here at
            // once, having forked nothing.)
            for job in jobs {
                job();
            }
        })?;
    Ok(FORKER.get_or_init(|| sender))
}

/// Which of the two mechanisms are on: both, always, outside tests.
#[derive(Clone, Copy, Debug)]
struct Switches {
    parent_death_signal: bool,
    group_guard: bool,
}

impl Switches {
    /// Both on. With the `test-util` feature, `REDQUORUM_NO_PARENT_DEATH_SIGNAL_FOR_TESTS=1`
    /// and `REDQUORUM_NO_GROUP_GUARD_FOR_TESTS=1` switch one off, so a real-process test can
    /// show what each one prevents.
    fn read() -> Switches {
        #[cfg(feature = "test-util")]
        {
            let off = |var: &str| std::env::var_os(var).is_some_and(|v| v == "1");
            Switches {
                parent_death_signal: !off("REDQUORUM_NO_PARENT_DEATH_SIGNAL_FOR_TESTS"),
                group_guard: !off("REDQUORUM_NO_GROUP_GUARD_FOR_TESTS"),
            }
        }
        #[cfg(not(feature = "test-util"))]
        Switches {
            parent_death_signal: true,
            group_guard: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use nix::sys::signal::{killpg, Signal};

    use super::*;

    /// The parent-death signal follows the thread that forked: a command asked for from a
    /// short-lived thread (a blocking-pool thread that idles out) must outlive that thread.
    /// Forked on the asking thread, the command is killed as soon as the thread ends.
    #[cfg(target_os = "linux")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_command_outlives_the_thread_that_started_it() {
        let runtime = tokio::runtime::Handle::current();
        let asker = std::thread::spawn(move || {
            let mut command = Command::new("sleep");
            command.arg("30");
            runtime.block_on(spawn(command))
        });
        let mut tethered = tokio::task::spawn_blocking(move || asker.join())
            .await
            .expect("the asking thread's join")
            .expect("the asking thread ended normally")
            .expect("the command starts");
        // The asking thread has ended; give a parent-death signal time to arrive.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let status = tethered.child.try_wait().expect("the command's status");
        let _ = killpg(tethered.pgid, Signal::SIGKILL);
        let _ = tethered.child.wait().await;
        tethered.release().await;
        assert_eq!(
            status, None,
            "the command died with the thread that asked for it, not with the process"
        );
    }
}
