//! The scenario list. Each module groups scenarios by area; every scenario ends with
//! [`crate::harness::AgentProc::finish`] (clean exit on EOF, no stdout violation, no leaked
//! process, no secret in the logs).

use crate::Scenario;

mod acp;
mod cli;
mod mcp;
mod tools;

/// Shared helpers for scenario bodies.
pub(crate) mod util {
    use std::path::{Path, PathBuf};

    /// A scratch directory plus a workspace directory `ws` inside it (the session cwd). The
    /// path is canonical, so it compares equal to what a child reads from `getcwd`.
    pub struct Scratch {
        pub dir: tempfile::TempDir,
        pub ws: PathBuf,
    }

    impl Scratch {
        pub fn new() -> Scratch {
            let dir = tempfile::Builder::new()
                .prefix("buzz-e2e-")
                .tempdir()
                .expect("tempdir");
            let ws = dir.path().canonicalize().expect("canonicalize").join("ws");
            std::fs::create_dir(&ws).expect("mkdir ws");
            Scratch { dir, ws }
        }

        /// A path in the scratch dir (outside the workspace), as a string.
        pub fn file(&self, name: &str) -> String {
            path_str(&self.dir.path().join(name))
        }
    }

    pub fn path_str(p: &Path) -> String {
        p.to_str().expect("UTF-8 path").to_string()
    }

    /// Waits until `path` exists and is non-empty; returns its content.
    pub fn wait_file(path: &str, timeout: std::time::Duration) -> String {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match std::fs::read_to_string(path) {
                Ok(s) if !s.is_empty() => return s,
                _ => {}
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{path} was not written within {timeout:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

macro_rules! list {
    ($($module:ident :: $name:ident),* $(,)?) => {
        vec![$((concat!(stringify!($module), "::", stringify!($name)), $module::$name as Scenario)),*]
    };
}

pub(crate) fn all() -> Vec<(&'static str, Scenario)> {
    list![
        acp::a1_initialize_capabilities,
        cli::p3_demo_runs_offline_with_one_objection,
        cli::p3_e2_hooks_check_passes_the_todo_example,
        cli::p3_e1_hooks_check_shows_testguard_objection,
        cli::p3_hooks_check_reports_a_hanging_hook,
        cli::c1_p3_help_version_and_config_errors,
        acp::c01_garbage_and_bom_lines_keep_serving,
        acp::t3_oversized_line_is_answered_once_and_reading_continues,
        acp::t4_unknown_method_bad_params_invalid_request,
        acp::c03_unknown_session_is_32002_everywhere,
        acp::c07_relative_cwd_rejected,
        tools::l1_l4_five_round_tool_prompt,
        tools::l2_unknown_and_hook_tool_names_are_unknown_tool,
        tools::l2_c26_invalid_tool_arguments_are_error_results_and_empty_means_empty_object,
        tools::l3_big_tool_result_is_middle_elided,
        tools::m7_server_crash_mid_call_gives_error_result_and_turn_continues,
        tools::c02_c11_mcp_banner_never_reaches_agent_stdout,
        mcp::c08_mcp_start_failures_name_server_and_stderr,
        mcp::m8_p1_stdin_eof_reaps_children_and_grandchildren,
        mcp::m1_children_do_not_get_agent_secrets,
    ]
}
