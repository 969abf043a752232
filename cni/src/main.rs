//! kroce-cni: the CNI plugin runtimes (Multus, containerd, CRI-O) execute
//! to attach an SR-IOV VF to a pod. It takes no flags: CNI_* environment and
//! the network configuration on stdin (see README.md).

use std::io::{Read, Write};

fn main() {
    let mut stdin = Vec::new();
    if let Some(arg) = std::env::args().nth(1) {
        let help = arg == "--help" || arg == "-h";
        let text = "kroce-cni: CNI plugin attaching an SR-IOV VF (VLAN, MAC, MTU, IPs, RDMA device) to a pod.\n\
            Run by container runtimes with CNI_COMMAND=ADD|DEL|CHECK|STATUS|GC|VERSION, CNI_CONTAINERID,\n\
            CNI_NETNS, CNI_IFNAME, CNI_ARGS, CNI_PATH and the network config on stdin.\n\
            Roots from the environment only (the runtime's, set by the installer): KROCE_CNI_HOST_ROOT,\n\
            KROCE_CNI_SYSFS_ROOT, KROCE_CNI_PROC_ROOT, KROCE_CNI_STATE_DIR (default /var/lib/cni/kroce,\n\
            root's, not group/world writable), KROCE_CNI_LOG_FILE (default: stderr only).\n\
            Try: CNI_COMMAND=VERSION kroce-cni </dev/null\n";
        let _ = std::io::stdout().write_all(text.as_bytes());
        std::process::exit(if help { 0 } else { 2 });
    }
    if let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
        let msg = serde_json::json!({"cniVersion":"1.1.0","code":5,"msg":format!("cannot read stdin: {e}")});
        let _ = writeln!(std::io::stdout(), "{msg}");
        std::process::exit(1);
    }
    let out = kroce_cni::entry::execute(&|k| std::env::var(k).ok(), &stdin);
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(out.stdout.as_bytes());
    if !out.stdout.is_empty() {
        let _ = stdout.write_all(b"\n");
    }
    let _ = stdout.flush();
    std::process::exit(out.exit_code);
}
