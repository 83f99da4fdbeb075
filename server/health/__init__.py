"""Health rules over the metric stream (pure functions), the alerts they raise, and diagnoses of crashes."""
