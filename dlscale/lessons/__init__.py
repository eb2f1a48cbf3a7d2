"""What only the lessons use: the exercise generator (:mod:`~dlscale.lessons.exercises`) and the
check functions the exercises call (:mod:`~dlscale.lessons.checks`). The engine never imports it.
"""
