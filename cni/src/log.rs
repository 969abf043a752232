//! Plugin log: lines to `logFile` at `logLevel`; warnings and errors also to
//! stderr, which runtimes pass into their own log. Passed explicitly.

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
}

impl LogLevel {
    pub fn parse(s: &str) -> Option<LogLevel> {
        match s.to_ascii_lowercase().as_str() {
            "error" | "panic" => Some(LogLevel::Error),
            "warn" | "warning" => Some(LogLevel::Warn),
            "info" => Some(LogLevel::Info),
            "debug" => Some(LogLevel::Debug),
            _ => None,
        }
    }

    fn label(&self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warning",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
        }
    }
}

#[derive(Debug)]
pub struct Logger {
    level: LogLevel,
    file: Option<Mutex<std::fs::File>>,
    stderr: bool,
    /// Prefix naming the request (command, container, ifname).
    context: String,
    /// Warnings kept for callers that report them (tests, STATUS).
    warnings: Mutex<Vec<String>>,
}

impl Logger {
    /// A logger writing to `file` (appended, created) when given.
    pub fn new(level: LogLevel, file: Option<&Path>, stderr: bool) -> std::io::Result<Logger> {
        let file = match file {
            None => None,
            Some(p) => {
                if let Some(parent) = p.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                Some(Mutex::new(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(p)?,
                ))
            }
        };
        Ok(Logger {
            level,
            file,
            stderr,
            context: String::new(),
            warnings: Mutex::new(Vec::new()),
        })
    }

    /// A logger that writes nowhere but keeps warnings.
    pub fn quiet() -> Logger {
        Logger {
            level: LogLevel::Error,
            file: None,
            stderr: false,
            context: String::new(),
            warnings: Mutex::new(Vec::new()),
        }
    }

    pub fn set_context(&mut self, ctx: String) {
        self.context = ctx;
    }

    fn log(&self, level: LogLevel, msg: &str) {
        if level <= LogLevel::Warn
            && let Ok(mut w) = self.warnings.lock()
        {
            w.push(msg.to_string());
        }
        let line = format!("kroce-cni {} {}: {msg}\n", level.label(), self.context);
        if self.stderr && level <= LogLevel::Warn {
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
        if level <= self.level
            && let Some(f) = &self.file
            && let Ok(mut f) = f.lock()
        {
            let ts = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or_default();
            let _ = f.write_all(format!("{ts:.3} {line}").as_bytes());
        }
    }

    pub fn error(&self, msg: &str) {
        self.log(LogLevel::Error, msg);
    }
    pub fn warn(&self, msg: &str) {
        self.log(LogLevel::Warn, msg);
    }
    pub fn info(&self, msg: &str) {
        self.log(LogLevel::Info, msg);
    }
    pub fn debug(&self, msg: &str) {
        self.log(LogLevel::Debug, msg);
    }

    /// Warnings and errors logged so far.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.lock().map(|w| w.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/cni.log");
        let log = Logger::new(LogLevel::Info, Some(&path), false).unwrap();
        log.debug("hidden");
        log.info("shown");
        log.warn("careful");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("hidden"));
        assert!(text.contains("info") && text.contains("shown"));
        assert_eq!(log.warnings(), vec!["careful".to_string()]);
        assert_eq!(LogLevel::parse("WARNING"), Some(LogLevel::Warn));
        assert_eq!(LogLevel::parse("loud"), None);
    }
}
