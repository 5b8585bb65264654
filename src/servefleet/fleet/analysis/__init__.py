"""The canary analysis of ``servefleet rollout --analysis``: a bounded load probe of one canary
instance and one instance not yet upgraded, side by side with the same prompts
(:mod:`.probe`), the rule that judges each measure (:mod:`.stats`), the verdict and its report
(:mod:`.report`: the terminal's table, ``--json``'s dict, an SVG of both latency distributions),
and the step the rollout runs after its canary batch (:mod:`.canary`)."""
