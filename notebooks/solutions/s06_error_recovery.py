def worst_case_wait(max_retries):
    """Seconds of waiting before call_model() gives up, with the largest jitter."""
    policy = s06.RetryPolicy(max_retries=max_retries, jitter=lambda: 1.0)
    return sum(s06.backoff_delay(retry, None, policy) for retry in range(1, max_retries + 1))
