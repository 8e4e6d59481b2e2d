"""The mutants argued equivalent by hand: a pattern over mutant labels (``fnmatch``) and the
argument, each naming what in the runtime makes the mutated cell unreachable or its change
invisible (``verification.mutation.equivalent.argument`` reads them; ``--check-arguments``
runs their mutants to check them)."""

BY_HAND: tuple[tuple[str, str], ...] = (
    *(
        (
            f"agent_job ({state}, started) *",
            (
                "never decided there: only run_part(session=True) sends started, after "
                "begin() accepted start or start_part, which new and held answer by "
                "leaving for starting or starting_held; no row enters new, and only "
                "new's job_holding enters held"
            ),
        )
        for state in ("new", "held")
    ),
    *(
        (
            f"agent_job ({state}, job_holding) *",
            (
                "never decided there: job_holding is the watch on the job machine entering "
                "awaiting_finalize, which only serving's rows enter and no row enters "
                "serving: it comes once per job, and it is what entered this state"
            ),
        )
        for state in ("held", "starting_held")
    ),
    (
        "agent_job (held, start_failed) *",
        (
            "never decided there: the job holds only once its room is followed (it knows "
            "the simulator from the room), after which start_runtime() returns at once; "
            "every other part begins with start or start_part, which leave held"
        ),
    ),
    (
        "agent_job (running, started) *",
        (
            "never decided there: started is sent by run_part(session=True) only, after "
            "claim_session(), which the session machine lets through once per job (its "
            "start leaves new for good); its started is "
            "the only way into running, so none comes after"
        ),
    ),
    (
        "agent_job (closed, started) *",
        (
            "never decided there: a session part still running once the release's "
            "participant step closed the link fails in link.start() (run_part sends "
            "start_failed), and closed comes only after that step"
        ),
    ),
    *(
        (
            f"avatar (idle, interrupt) -> {kind}",
            (
                "effect finds nothing: clear_local_buffer acts only on the plugin's installed "
                "sink, recorded only by the effects of starting (start_plugin, record_route), "
                "and no row enters idle"
            ),
        )
        for kind in ("ignore", "reject")
    ),
    (
        "avatar (clearing, start_error) *",
        (
            "never decided there: past starting, start_error is only the reinstall's failure "
            "(start_plugin's dies with starting), queued in the rejoin's own step "
            "(reinstall_route is synchronous) behind events posted before it, from backoff or "
            "restored, entered only after failed (on route_restored, or from retiring, "
            "entered only from failed and restored); the one way into clearing is an "
            "interrupt marked delivered, which the runtime marks only as it posts it in "
            "joined or clearing: before route_restored (so decided before the rejoin) or "
            "after the rejoin's step queued the failure (so decided after it)"
        ),
    ),
    (
        "session (closed, start) reject -> *",
        (
            "the same refusal: the job's machine is closed only by the job runtime's "
            "release (a runtime used alone closes only its own, which nothing claims), "
            "after the lifecycle left running (begin() refuses every start there), so a "
            "claim meets closed only when the job closed on its own while a start was "
            "between begin() and its claim; the claim refused says 'the job was closed "
            "before it finished starting', and a claim let through has its start part "
            "refused the same way (the release closed the session host first, so attach() "
            "raises and run_part reports a start the job closed under): nothing starts"
        ),
    ),
)
