//! STATUS: can ADD work? The state dir must be writable and the IPAM
//! delegate present and answering (its own STATUS when it speaks 1.1.0).

use super::{Backends, Node, Request};
use crate::ipam;
use crate::log::Logger;
use crate::protocol::{CniError, Command, code};

pub fn status(
    req: &Request,
    node: &Node,
    b: &mut Backends<'_>,
    _log: &Logger,
) -> Result<(), CniError> {
    node.state.probe_writable().map_err(|e| {
        CniError::new(
            code::NOT_AVAILABLE,
            format!(
                "state dir {} is not writable: {e}",
                node.state.root().display()
            ),
        )
    })?;
    let Some(i) = &req.conf.ipam else {
        return Ok(());
    };
    let unavailable = |e: ipam::IpamError| CniError::new(code::NOT_AVAILABLE, e.to_string());
    ipam::find_plugin(&i.plugin, &req.env.path).map_err(unavailable)?;
    let ireq = req.ipam_request(Command::Status, &i.plugin);
    if ipam::speaks_1_1(b.ipam, &ireq).map_err(unavailable)? {
        b.ipam.exec(&ireq).map_err(|e| {
            let code = match e.delegate_code() {
                Some(c @ (code::NOT_AVAILABLE | code::NOT_AVAILABLE_LIMITED)) => c,
                _ => code::NOT_AVAILABLE,
            };
            CniError::new(code, e.to_string())
        })?;
    }
    Ok(())
}
