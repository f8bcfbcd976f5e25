team_config = """\
approvals:
  yolo: on
  deny: ['*git push *--force*', '*git push -f', '*git push -f *', '*git push * -f', '*git push * -f *']
max_iterations: ${TEAM_MAX_ITERATIONS}
"""
