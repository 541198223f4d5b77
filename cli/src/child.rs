//! Running a command only while a lease is held: `lock run`, `election run` and `job run`.

use std::process::ExitCode;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use redquorum::LockGuard;

/// How a command run under a lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// It exited by itself with this code (128+N if signal N ended it).
    Exited(u8),
    /// The lease was lost: its process group was stopped (exit 4).
    LeaseLost,
    /// We got SIGINT (130) or SIGTERM (143): its process group was stopped.
    Stopped(u8),
}

impl Ended {
    /// The exit code that reports it.
    pub(crate) fn code(self) -> ExitCode {
        match self {
            Ended::Exited(code) | Ended::Stopped(code) => ExitCode::from(code),
            Ended::LeaseLost => ExitCode::from(4),
        }
    }
}

/// [`supervise`], reported as an exit code.
pub(crate) async fn run_while_held(
    guard: &LockGuard,
    name: &str,
    command: &[String],
    env: &[(&str, String)],
    stop: Stop,
) -> Result<ExitCode, redquorum::Error> {
    supervise(guard, name, command, env, stop)
        .await
        .map(Ended::code)
}

/// Run `command` while `guard`'s lease is held, with `env` added to its environment, in a
/// process group of its own, tethered to this process: if we die (`kill -9`, OOM), the
/// command and its group are killed too (see `tether.rs`). Ends with the child's exit code (128+signal if a signal ended
/// it); on loss of the lease the group gets SIGTERM, then SIGKILL once the remaining validity
/// is used up ([`Ended::LeaseLost`], code 4); on our own SIGTERM/SIGINT the group gets SIGTERM,
/// 5 s (never past the lease) to end, then SIGKILL ([`Ended::Stopped`], 143/130). The caller
/// releases the lease afterwards. `stop` is the caller's listener for our own signals (made
/// before the child starts, and before anything the caller waited for: a signal between two
/// listeners would be lost).
pub(crate) async fn supervise(
    guard: &LockGuard,
    name: &str,
    command: &[String],
    env: &[(&str, String)],
    stop: Stop,
) -> Result<Ended, redquorum::Error> {
    let (program, args) = match command.split_first() {
        Some(split) => split,
        None => {
            return Err(redquorum::Error::InvalidArgument(
                "no command given after --".into(),
            ))
        }
    };
    let mut command = tokio::process::Command::new(program);
    command.args(args).envs(env.iter().map(|(k, v)| (k, v)));
    let mut tethered = match crate::tether::spawn(command).await {
        Ok(t) => t,
        Err(e) => {
            return Err(redquorum::Error::InvalidArgument(format!(
                "cannot run {program:?}: {e}"
            )));
        }
    };
    let pgid = tethered.pgid;
    let kill_group = |sig: Signal| {
        let _ = killpg(pgid, sig);
    };
    let ended = watch(&mut tethered.child, guard, name, stop, kill_group).await;
    tethered.release().await;
    Ok(ended)
}

/// Wait for the first of: the command's exit, the loss of the lease, our own signal; stop
/// the command's group for the last two.
async fn watch(
    child: &mut tokio::process::Child,
    guard: &LockGuard,
    name: &str,
    stop: Stop,
    kill_group: impl Fn(Signal),
) -> Ended {
    use std::os::unix::process::ExitStatusExt;

    tokio::select! {
        status = child.wait() => {
            let code = match status {
                Ok(st) => st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)),
                Err(_) => 1,
            };
            Ended::Exited(u8::try_from(code).unwrap_or(1))
        }
        reason = guard.lost() => {
            // Stop the child before anyone else can hold the lock: SIGTERM now, SIGKILL once
            // the remaining validity is used up.
            eprintln!("redquorum: lease on {name:?} lost ({reason}); stopping the command");
            kill_group(Signal::SIGTERM);
            let exited = tokio::select! {
                _ = child.wait() => true,
                () = validity_ended(guard) => false,
            };
            if !exited {
                kill_group(Signal::SIGKILL);
                let _ = child.wait().await;
            }
            kill_group(Signal::SIGKILL); // grandchildren that outlived the child
            Ended::LeaseLost
        }
        code = stop => {
            kill_group(Signal::SIGTERM);
            stop_within_lease(child, guard, kill_group).await;
            Ended::Stopped(code)
        }
    }
}

/// After SIGTERM was sent to the child's group on our own shutdown: give it up to 5 s to end,
/// but never past the lease (the guard keeps extending meanwhile; if the lease is lost, SIGKILL
/// goes out by its deadline), then SIGKILL what is left of the group.
async fn stop_within_lease(
    child: &mut tokio::process::Child,
    guard: &LockGuard,
    kill_group: impl Fn(Signal),
) {
    tokio::select! {
        _ = tokio::time::timeout(Duration::from_secs(5), child.wait()) => {}
        _ = guard.lost() => {
            tokio::select! {
                _ = child.wait() => {}
                () = validity_ended(guard) => {}
            }
        }
    }
    kill_group(Signal::SIGKILL);
    let _ = child.wait().await;
}

/// The longest sleep between two readings of the lease's validity during a SIGKILL grace.
const GRACE_SLICE: Duration = Duration::from_millis(100);

/// Until `guard`'s validity has ended ([`LockGuard::valid_until`]: the earlier of the
/// monotonic and the boot clock's ends). The wait reads the validity again at least every
/// [`GRACE_SLICE`]: a sleep runs on the monotonic clock, which stops while the host is
/// suspended, so one sleep for the whole grace would let the command run on after a resume for
/// as long as the host slept, past the validity; in slices it gets SIGKILL within a slice of
/// the resume.
async fn validity_ended(guard: &LockGuard) {
    loop {
        let left = guard
            .valid_until()
            .saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(left.min(GRACE_SLICE)).await;
    }
}

/// A [`stop_signal`] kept across the phases of one command.
pub(crate) type Stop = std::pin::Pin<Box<dyn std::future::Future<Output = u8> + Send>>;

/// `taking` (an acquisition, which may wait a long time for a holder) unless `stop` fires
/// first: then `taking` is dropped, which releases a round in flight (or a lease it won) in
/// the background, and this waits `settle` (the client's node timeout) for those releases
/// before it returns the signal's exit code. Without it a SIGTERM during the wait killed the
/// process at once, and a round in flight stayed on the nodes until a waiter watched it for
/// its TTL.
pub(crate) async fn unless_stopped<T>(
    taking: impl std::future::Future<Output = T>,
    stop: &mut Stop,
    settle: std::time::Duration,
) -> Result<T, u8> {
    let outcome = tokio::select! {
        taken = taking => Ok(taken),
        code = stop => Err(code),
    };
    if outcome.is_err() {
        tokio::time::sleep(settle).await;
    }
    outcome
}

/// Until SIGINT or SIGTERM; the exit code that reports it (130 or 143). Both handlers are
/// installed when this is called, not when the future is first polled: a signal that arrives
/// before the future's first poll (a watcher is signalled right after its first output line)
/// is then caught, where a lazy registration let the default action kill the process without
/// leaving or resigning. Keep one listener per command: a signal that comes after one listener
/// was last polled and before the next is made is seen by neither.
pub(crate) fn stop_signal() -> impl std::future::Future<Output = u8> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigterm = signal(SignalKind::terminate()).ok();
    let mut sigint = signal(SignalKind::interrupt()).ok();
    async move {
        tokio::select! {
            _ = received(sigint.as_mut()) => 130,
            _ = received(sigterm.as_mut()) => 143,
        }
    }
}

/// Until `signal` is received; forever when its handler could not be installed.
async fn received(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A signal that comes after the stop future is made but before it is first polled (a
    /// watcher signalled right after its first output line) is caught, not fatal or lost. With
    /// the handlers installed on the first poll, SIGTERM here kills the test process.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_signal_before_the_stop_future_is_first_polled_is_caught() {
        let stop = stop_signal();
        nix::sys::signal::raise(Signal::SIGTERM).expect("raise SIGTERM");
        let code = tokio::time::timeout(Duration::from_secs(5), stop)
            .await
            .expect("the SIGTERM raised before the first poll must end the stop future");
        assert_eq!(code, 143, "SIGTERM reports 143");
    }
}
