//! The scenario list. Each module groups scenarios by area; every scenario ends with
//! [`crate::harness::AgentProc::finish`] (clean exit on EOF, no stdout violation, no leaked
//! process, no secret in the logs).

use crate::Scenario;

mod acp;
mod caching;
mod cases;
mod cli;
mod clients;
mod commands;
mod compaction;
mod context;
mod dialect_cases;
mod effort;
mod hooks;
mod interceptors;
mod lifecycle;
mod mcp;
mod mcp_http;
mod mcp_http_faults;
mod mcp_http_hooks;
mod oauth;
mod providers;
mod security;
mod session_hooks;
mod sessions;
mod stderr;
mod tools;

pub(crate) mod setup;
pub(crate) mod util;

macro_rules! list {
    ($($module:ident :: $name:ident),* $(,)?) => {
        vec![$((concat!(stringify!($module), "::", stringify!($name)), $module::$name as Scenario)),*]
    };
}

/// The scenarios that need a tool of the machine (`strace`): trials reported ignored, with
/// the reason, where it is missing.
pub(crate) fn tool_trials(ctx: &crate::Ctx) -> Vec<libtest_mimic::Trial> {
    sessions::strace_trials(ctx)
}

pub(crate) fn all() -> Vec<(&'static str, Scenario)> {
    list![
        acp::a1_initialize_capabilities,
        cli::c1_p3_c30_help_version_and_config_errors,
        cli::c1_every_configuration_error_is_reported_in_one_run,
        cli::p3_a_terminal_on_stdin_gets_a_hint_and_a_pipe_does_not,
        acp::c01_garbage_and_bom_lines_keep_serving,
        acp::t3_oversized_line_is_answered_once_and_reading_continues,
        acp::c50_a_request_over_the_line_cap_is_answered_with_its_own_id,
        acp::t4_unknown_method_bad_params_invalid_request,
        acp::c03_unknown_session_is_32002_everywhere,
        acp::c07_relative_cwd_rejected,
        acp::a3_the_readme_copy_paste_session_reaches_end_turn,
        tools::l1_l4_five_round_tool_prompt,
        tools::m14_odd_tool_schemas_are_offered_in_a_form_the_provider_accepts,
        tools::l2_unknown_and_hook_tool_names_are_unknown_tool,
        tools::l2_c26_invalid_tool_arguments_are_error_results_and_empty_means_empty_object,
        tools::l3_big_tool_result_is_middle_elided,
        tools::m7_server_crash_mid_call_gives_error_result_and_turn_continues,
        tools::c02_c11_mcp_banner_never_reaches_agent_stdout,
        mcp::c08_mcp_start_failures_name_server_and_stderr,
        mcp_http::m10_tools_over_streamable_http_carry_the_session_and_end_with_delete,
        mcp_http::m10_a_restarted_server_gets_a_new_session_and_the_call_goes_through,
        mcp_http::m10_server_requests_on_a_slow_get_stream_are_not_lost,
        mcp_http::m10_a_legacy_sse_server_serves_tool_calls,
        mcp_http::m10_a_remote_stop_hook_objects_over_http,
        mcp_http::m10_unusable_http_servers_fail_the_session_with_a_reason,
        mcp_http_hooks::h4_m10_a_silent_remote_hook_times_out_twice_and_its_session_is_dropped,
        mcp_http_hooks::h5_m10_a_remote_hook_that_always_objects_spends_the_budget_exactly,
        mcp_http_hooks::x1_m10_a_remote_validator_denies_a_tool_call,
        mcp_http_faults::m10_a2_a_remote_server_that_cannot_start_fails_session_new_with_its_name_and_why,
        mcp_http_faults::m10_m5_a_remote_call_that_fails_or_floods_leaves_the_other_server_serving,
        oauth::m11_a_server_behind_oauth_is_authorized_through_the_browser_and_its_tokens_are_kept,
        oauth::m11_a_rejected_token_is_refreshed_and_a_missing_scope_is_stepped_up,
        oauth::m11_client_credentials_need_no_user_and_a_failed_login_leaves_the_server_without_tools,
        oauth::m11_a_client_with_url_elicitation_shows_the_login_and_is_told_when_it_is_done,
        oauth::m11_a_declined_login_leaves_the_server_without_tools_and_the_session_says_why,
        oauth::m11_an_authorization_server_failing_tls_or_answering_garbage_leaves_the_server_without_tools,
        oauth::m11_a_login_the_client_shows_is_completed_when_the_session_fails_to_start,
        mcp::m8_p1_c33_stdin_eof_reaps_children_and_grandchildren,
        mcp::m1_children_do_not_get_agent_secrets,
        mcp::m13_roots_list_answers_the_cwd_and_the_additional_directories,
        mcp::m12_a_server_elicitation_goes_to_a_client_that_presents_forms_and_back,
        security::s1_a_server_cannot_read_the_agents_environment_through_proc,
        security::s6_peer_text_reaches_the_text_and_json_logs_escaped,
        security::s2_a_redirect_is_never_followed_with_the_api_key,
        security::s2_credentials_in_the_base_url_are_redacted_everywhere,
        security::s2_an_mcp_servers_redirect_is_never_followed_with_its_headers,
        security::s3_a_permission_request_names_the_registered_server_whatever_title_the_server_chose,
        security::s5_a_server_listing_too_many_tools_is_cut_off_and_others_keep_working,
        security::s5_a_server_whose_tool_list_is_over_4_mib_is_cut_off_and_others_keep_working,
        security::s5_a_server_sending_request_ids_over_1_kib_is_cut_off_and_others_keep_working,
        security::s5_a_server_that_stops_reading_its_stdin_is_cut_off_at_32_mib_queued,
        security::s8_a_state_directory_others_can_write_to_is_never_used_nor_its_permission_memory,
        security::s7_a_grandchild_that_calls_setsid_does_not_outlive_the_agent,
        security::s7_no_process_group_is_signalled_after_its_leader_was_reaped,
        security::m3_names_that_collide_a_tool_never_takes_the_name_of_another_servers_hook,
        security::m3_names_that_collide_a_forged_exposed_name_leads_to_one_server,
        hooks::h5_h6_hook_objects_once_then_clears_end_turn,
        hooks::h5_always_objecting_budget_1_makes_exactly_the_predicted_calls,
        hooks::h5_i2_budget_resets_per_prompt,
        hooks::m4_h2_hooks_hidden_and_not_called_without_allowlist,
        hooks::h4_hook_timeout_fails_open_then_second_timeout_kills_group,
        hooks::h3_four_hook_servers_run_concurrently,
        hooks::a7_h8_stop_reaches_server_once_without_permission_request,
        hooks::g1_g2_reply_guard,
        hooks::h5_g1_budget_zero_disables_stop_and_reply_guard,
        hooks::h3_meta_carries_point_session_attempt_budget,
        hooks::h4_fail_open_error_iserror_empty_never_object,
        session_hooks::h10_session_start_goes_right_after_the_first_prompt_and_into_no_other,
        session_hooks::h10_h4_a_silent_session_start_hook_delays_session_new_by_one_timeout_and_fails_open,
        session_hooks::h11_session_end_runs_once_at_eof_with_reason_and_prompt_count,
        session_hooks::h11_p1_sigterm_with_a_silent_session_end_hook_still_exits_in_bound,
        session_hooks::h11_session_close_runs_session_end_stops_the_servers_and_answers,
        interceptors::x1_a_denying_validator_stops_a_real_tool_call,
        interceptors::x1_a_mutator_rewrites_the_arguments_the_server_receives,
        interceptors::x1_an_audit_validator_only_logs,
        interceptors::x1_a_crashing_interceptor_blocks_unless_it_fails_open,
        interceptors::x1_h4_a_silent_interceptor_times_out_closed_and_its_second_timeout_kills_it,
        interceptors::x1_a4_cancel_mid_chain_cancels_the_invocation,
        interceptors::x1_interceptor_servers_tools_stay_callable_only_if_they_are_also_ordinary_servers,
        interceptors::x1_a7_an_allowed_call_still_asks_permission,
        interceptors::s4_every_way_an_interceptor_gate_goes_missing_blocks_the_call,
        interceptors::s4_a_malformed_rewrite_of_a_tool_result_blocks_it,
        compaction::k1_h7_compaction_summary_then_postcompact_then_live_prompt,
        compaction::h7_empty_postcompact_injects_nothing,
        compaction::h7_postcompact_timeout_goes_on_without_it,
        compaction::k1_summary_failure_falls_back_to_truncation,
        compaction::l5_k1_context_too_long_400_compacts_then_succeeds,
        compaction::k1_l5_a_full_context_window_stop_compacts_and_the_round_runs_again,
        compaction::l1_max_tokens_partial_tool_call_not_run_nudge_then_recovery,
        lifecycle::a7_every_malformed_or_negative_outcome_denies,
        lifecycle::a7_allow_runs_exactly_once_after_the_answer,
        lifecycle::a7_allow_always_is_remembered_per_tool,
        lifecycle::a7_permission_timeout_denies,
        lifecycle::a7_parallel_calls_each_ask,
        lifecycle::a4_c04_cancel_during_llm_stream,
        lifecycle::a4_cancel_during_backoff,
        lifecycle::a4_cancel_during_permission_wait,
        lifecycle::a4_c04_cancel_during_tool_call_sends_notifications_cancelled,
        lifecycle::a4_cancel_during_hook_gate_finishes_within_timeout_then_cancelled,
        lifecycle::a4_a3_cancel_then_prompt_runs_the_new_prompt_after,
        lifecycle::a4_c04_cancel_when_idle_and_twice_is_harmless,
        lifecycle::a4_cancel_of_a_stalled_stream_closes_its_connection_at_once,
        lifecycle::m9_crashed_server_recovers_after_backoff,
        lifecycle::m9_three_deaths_make_it_permanent_and_tools_leave_the_list,
        lifecycle::m6_tools_list_changed_relists,
        lifecycle::p1_c33_sigterm_sigint_and_sighup_shut_down_cleanly,
        lifecycle::m8_c34_sh_c_launcher_with_term_ignoring_grandchild_is_killed_on_agent_exit,
        providers::l6_l7_l8_five_round_tool_prompt_on_every_route,
        providers::l7_every_round_of_a_session_uses_one_kept_alive_connection,
        providers::l5_c28_429_retry_after_is_honoured_then_success,
        providers::l5_c28_529_then_503_back_off_then_success,
        providers::l6_overloaded_error_event_before_text_is_retried,
        providers::c24_body_cut_mid_event_is_retried_then_succeeds,
        providers::c24_finish_without_done_is_success_without_retry,
        providers::c24_finish_then_connection_left_open_completes_after_grace,
        providers::l5_c24_stalled_body_hits_idle_timeout_and_is_retried,
        providers::l5_stalled_body_with_one_attempt_is_an_llm_error,
        providers::l5_retries_exhausted_is_an_llm_error_naming_the_status,
        providers::l5_401_is_llm_auth_error_without_retry,
        providers::l5_400_is_an_llm_error_with_the_provider_message,
        providers::l5_text_streamed_then_cut_is_not_retried,
        providers::a4_l5_cancel_during_long_backoff_is_prompt,
        providers::l9_utf8_split_inside_characters_gives_exact_text,
        providers::l9_lone_surrogate_becomes_replacement_character,
        providers::c21_tool_call_deltas_without_ids_get_synthesised_paired_ids,
        providers::c22_usage_only_and_empty_choices_chunks_are_accepted,
        providers::c23_missing_or_stop_finish_reason_with_complete_tool_calls_runs_tools,
        caching::l11_anthropic_breakpoints_roll_and_the_prefix_holds_across_an_objection_and_a_reload,
        caching::l11_caching_off_sends_no_breakpoint_and_no_cache_key,
        caching::l11_the_openai_routes_send_one_key_per_session_only_where_the_endpoint_takes_it,
        caching::a6_l11_usage_with_cache_tokens_and_cost_reaches_the_client_on_every_route,
        effort::l12_effort_reaches_every_route_and_set_config_option_changes_it_from_the_next_request,
        effort::l12_a_refused_form_of_anthropic_thinking_is_switched_once_to_the_other,
        cases::c13_server_requests_are_answered_in_their_own_id_space,
        cases::c36_invalid_utf8_mcp_reply_is_decoded_lossily,
        cases::c64_lone_surrogates_are_decoded_at_every_json_boundary_and_answered,
        cases::c65_a_tool_list_changed_during_a_round_is_offered_in_the_very_next_request,
        cases::c14_unanswered_initialize_and_timed_out_call_are_bounded_cancelled_and_killed,
        cases::c15_error_replies_iserror_and_exits_resolve_at_once_with_the_cause,
        cases::h4_c30_late_hook_reply_never_satisfies_the_next_call_and_a_reply_resets_the_count,
        cases::h4_c30_c34_hanging_stubborn_hook_launcher_bounds_every_prompt_and_its_group_dies,
        cases::h5_c31_always_blocking_stop_is_capped_per_prompt_and_errors_never_block,
        cases::p1_c33_client_killed_stdin_eof_and_broken_stdout_exit_cleanly,
        cases::m8_c34_sh_c_launcher_groups_die_on_start_failure_and_oversize_line,
        dialect_cases::c37_two_calls_at_index_0_run_as_two_calls,
        dialect_cases::c39_stop_objection_while_thinking_keeps_the_signed_thinking_block,
        dialect_cases::c40_fastmcp_none_is_empty_and_its_text_objects_once,
        dialect_cases::c41_max_tokens_rejected_is_retried_as_max_completion_tokens_and_remembered,
        dialect_cases::c61_chat_objection_is_one_assistant_message_with_text_and_the_call,
        dialect_cases::c63_one_tool_with_a_root_any_of_no_longer_fails_every_anthropic_prompt,
        clients::c63_a_tool_dropped_for_its_schema_is_told_to_the_client,
        dialect_cases::c69_a_pause_turn_is_continued_and_stop_runs_once_at_the_real_end,
        dialect_cases::c77_after_a_refusal_the_next_prompt_is_answered_on_every_route,
        dialect_cases::c77_a_streamed_chat_refusal_is_shown_and_leaves_the_history,
        dialect_cases::l13_a_cancelled_prompt_stays_as_its_own_marked_turn,
        dialect_cases::l5_a_vllm_abort_finish_is_retried_a_bounded_number_of_times,
        dialect_cases::l8_a_model_only_the_responses_api_serves_moves_the_session_to_the_responses_route,
        stderr::c51_unread_stderr_pipe_never_blocks_the_loop_and_drops_are_counted,
        stderr::c52_endless_server_stderr_line_is_cut_and_skipped_without_buffering,
        stderr::a6_unread_stdout_never_blocks_the_loop_and_loses_no_line,
        clients::c53_tool_call_kind_and_title_come_from_the_mcp_tool,
        clients::c54_an_is_error_result_is_failed_with_its_text_and_the_turn_goes_on,
        clients::c55_lenient_session_new_skips_other_transports_and_maps_odd_names,
        clients::c56_a_hook_server_missing_from_the_allowlist_is_warned_about_once,
        clients::c58_models_are_advertised_and_both_ways_of_setting_one_work,
        clients::c59_images_audience_and_progress_from_mcp_tools,
        clients::c60_answers_after_an_objection_are_paragraphs_and_a_notice_says_why,
        clients::c60_a_client_that_presents_notices_gets_an_acp_notice,
        clients::c60_no_requirement_ids_in_any_text_a_user_or_the_model_reads,
        clients::l5_llm_failures_name_the_url_and_a_json_body_is_not_a_truncated_stream,
        clients::p2_the_startup_log_shows_settings_as_the_environment_takes_them,
        sessions::a9_prompt_exit_load_prompt_again_continues_the_history,
        sessions::a9_kill_9_mid_round_then_load_pairs_every_tool_call,
        sessions::a9_kill_9_the_moment_the_answer_is_read_never_loses_the_answered_turn,
        sessions::a9_session_list_pages_newest_first_with_a_cwd_filter,
        sessions::a9_path_traversal_and_unknown_ids_are_refused_and_nothing_is_touched,
        sessions::a9_a_torn_last_line_is_ignored_with_a_warning_and_cut_off,
        sessions::a9_a_second_agent_loading_an_open_session_is_refused,
        sessions::a9_an_unparseable_transcript_is_32000_naming_file_and_line_and_left_alone,
        sessions::a9_session_resume_continues_without_replay,
        sessions::a9_state_dir_off_saves_nothing_and_the_default_follows_xdg,
        context::a10_instructions_reach_the_first_request_user_file_then_root_down_to_the_cwd,
        context::a10_no_hints_reads_nothing_and_a_cut_or_binary_file_is_warned_and_noticed,
        context::a10_an_agents_md_that_is_a_directory_or_a_fifo_is_skipped_with_a_warning,
        context::a10_skills_are_listed_without_bodies_and_load_skill_returns_the_body,
        context::a10_ten_thousand_skills_are_capped_and_no_hints_offers_none,
        context::a10_instructions_and_skills_are_read_again_on_session_load_not_on_every_round,
        context::a10_a_servers_tool_named_load_skill_never_shadows_the_built_in,
        commands::a11_prompts_are_offered_as_commands_and_a_list_change_sends_the_new_list,
        commands::a11_a_command_runs_prompts_get_and_its_messages_are_the_users_turn,
        commands::a11_a_cancel_while_prompts_get_is_in_flight_answers_cancelled,
    ]
}

/// The scenarios of the `extras` subcommands (`demo`, `exec`, `example-server`, `hooks check`): run
/// against a binary built with them, reported ignored against one without.
pub(crate) fn extras() -> Vec<(&'static str, Scenario)> {
    list![
        cli::p3_demo_runs_offline_with_one_objection,
        cli::p3_e2_hooks_check_passes_the_todo_example,
        cli::p3_e1_hooks_check_shows_testguard_objection,
        cli::p3_hooks_check_reports_a_hanging_hook,
        cli::p3_c57_hooks_check_fails_without_a_hook_point_and_names_near_misses,
        cli::p3_c57_hooks_check_shows_the_servers_error_text_and_prefixes_its_stderr,
        cli::p3_c57_hooks_check_flags_answers_that_object_only_by_their_shape,
        cli::p3_c64_hooks_check_judges_a_hook_answer_as_the_agent_does,
        cli::p3_hooks_check_lists_the_tools_and_hooks_the_agent_would_see,
        cli::p3_hooks_check_reports_an_exited_server_at_once,
        security::s1_p3_hooks_check_passes_a_server_only_the_allowlisted_environment,
        security::s6_exec_prints_peer_text_escaped,
        security::s6_hooks_check_prints_the_servers_text_escaped,
        security::s3_exec_approve_reads_shows_the_real_server,
        cli::p3_hooks_alone_prints_its_usage,
        cli::p3_e2_exec_runs_a_prompt_end_to_end_with_mcp_servers_and_a_hook,
        cli::m10_exec_connects_the_http_entries_of_an_mcp_config,
        cli::a7_exec_approve_reads_and_none_deny_tools_that_are_not_reads,
        cli::l5_exec_prints_an_llm_error_and_exits_1,
        cli::c1_exec_usage_config_file_and_configuration_errors_exit_2,
        cli::p3_the_readme_json_by_hand_block_runs_as_written,
        cli::a10_p3_the_readme_fixture_project_shows_its_instructions_and_loads_a_skill,
        session_hooks::h10_e2_todo_reinjects_open_items_at_session_start,
        session_hooks::p3_h10_h11_hooks_check_covers_the_session_points,
        interceptors::x1_example_server_interceptors_passes_the_list_and_invoke_fixtures_over_stdio,
        interceptors::x1_p3_demo_interceptors_shows_a_dangerous_call_denied,
    ]
}

/// The scenarios run under every dialect profile (`dialects::<profile>::<scenario>` trials):
/// hooks (objection, budget, several servers, fail-open), compaction (`_PostCompact` after a
/// summary, nothing injected, max-tokens nudges), cancel (during a tool call, during the
/// stream, then the next prompt), retry (5xx back-off, a body cut mid-event), the 5-round
/// tool loop, and a saved session loaded by a new agent, after an exit and after a `kill -9`
/// (SPEC A9, L10: the reasoning state replayed after the load stays valid). Each builds its fake LLM with `ctx.fake_llm*`, so it speaks the profile, and
/// checks the requests with the route-independent helpers of `fake_llm`.
pub(crate) fn dialect_matrix() -> Vec<(&'static str, Scenario)> {
    list![
        tools::l1_l4_five_round_tool_prompt,
        tools::m14_odd_tool_schemas_are_offered_in_a_form_the_provider_accepts,
        hooks::h5_h6_hook_objects_once_then_clears_end_turn,
        hooks::h5_always_objecting_budget_1_makes_exactly_the_predicted_calls,
        hooks::h3_four_hook_servers_run_concurrently,
        hooks::h4_fail_open_error_iserror_empty_never_object,
        session_hooks::h10_session_start_goes_right_after_the_first_prompt_and_into_no_other,
        compaction::k1_h7_compaction_summary_then_postcompact_then_live_prompt,
        compaction::h7_empty_postcompact_injects_nothing,
        compaction::l1_max_tokens_partial_tool_call_not_run_nudge_then_recovery,
        lifecycle::a4_c04_cancel_during_llm_stream,
        lifecycle::a4_c04_cancel_during_tool_call_sends_notifications_cancelled,
        lifecycle::a4_a3_cancel_then_prompt_runs_the_new_prompt_after,
        providers::l5_c28_529_then_503_back_off_then_success,
        providers::c24_body_cut_mid_event_is_retried_then_succeeds,
        sessions::a9_prompt_exit_load_prompt_again_continues_the_history,
        sessions::a9_kill_9_mid_round_then_load_pairs_every_tool_call,
    ]
}
