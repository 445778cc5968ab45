"""Other programs' storage patterns, replayed for ``fleetstore stress --compare``:
plain connections as agent tools open them (``plain``) and t3code's effect outbox
(``t3code_outbox``).  Never used by fleetstore itself."""
