"""What a run leaves behind: its folder under the results folder (manifest, logs, dumps), one
CaseRecord per case, and the versions of the stack it ran."""
