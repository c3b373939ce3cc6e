"""flexinfer.scheduler"""
