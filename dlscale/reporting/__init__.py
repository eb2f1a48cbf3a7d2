"""What a person reads: figures (:mod:`~dlscale.reporting.plots`), Markdown tables
(:mod:`~dlscale.reporting.tables`) and a sweep's report (:mod:`~dlscale.reporting.report`,
``dlscale report``).
"""
