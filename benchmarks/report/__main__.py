from benchmarks.report.sections import main

main()
