"""Task data: prompt builders and the synthetic worlds of the offline demo."""
