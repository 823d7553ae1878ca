"""The plugin's own wing: what one pytest process of a run holds (session) and what it writes into
the run folder (writing). harness.plugin wires both to pytest's hooks."""
