"""A project's alert rules, edited in the page: built-in rules tuned or turned off, custom rules on any metric, replayed on history."""
