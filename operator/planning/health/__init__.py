"""What the engines' health means, pure: each group's rank health, what a poll reads, the Degraded condition,
restarts as a unit and the playbooks that answer an incident."""
