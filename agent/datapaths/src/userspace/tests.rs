//! The loop's own behaviour, apart from any pod.

use super::*;

#[test]
fn a_loop_that_ends_by_a_bug_is_seen_to_have_stopped() {
    let shell = Shell::start(budget::DEFAULT_BYTES, IoBatch::DEFAULT).unwrap();
    assert!(shell.running());
    assert_eq!(shell.counters("pod-0"), None, "the loop answers while it runs");
    shell.send(Command::Panic);
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while shell.running() {
        assert!(Instant::now() < deadline, "the loop still runs 10 s after it panicked");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(shell.counters("pod-0"), None, "a stopped loop answers nothing, and holds up no caller");
}
